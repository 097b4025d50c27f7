"""Which storage backend the suite runs on (see conftest's ``--storage-url``)."""

from __future__ import annotations

from pathlib import Path

STORAGE_URL_ENV = "MEMORY_MCP_TEST_STORAGE_URL"


def database_in(tmp_path: Path, storage_url: str) -> Path | None:
    """The SQLite file a fixture opens, or None when another backend is selected."""
    return None if storage_url else tmp_path / "memory.db"
