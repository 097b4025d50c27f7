"""``storage.url`` picks the backend; the factory opens it or says why it cannot."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memory_mcp.config import Settings, StorageSettings, load_settings
from memory_mcp.errors import ConfigError, StorageError
from memory_mcp.storage.factory import open_store, redacted

pytestmark = pytest.mark.anyio


def with_url(url: str, data_dir: Path) -> Settings:
    return Settings(data_dir=str(data_dir), storage=StorageSettings(url=url))


@pytest.mark.sqlite_only
async def test_an_empty_url_opens_the_sqlite_file_in_the_data_directory(tmp_path: Path) -> None:
    store = await open_store(with_url("", tmp_path))
    try:
        assert (store.backend, store.location) == ("sqlite", str(tmp_path / "memory.db"))
        assert "SQLite" in store.details
    finally:
        await store.close()
    assert (tmp_path / "memory.db").is_file()


@pytest.mark.sqlite_only
async def test_a_sqlite_url_names_the_file(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "mine.db"
    target.parent.mkdir()
    settings = with_url(f"sqlite://{target}", tmp_path)
    assert settings.database_path() == target
    store = await open_store(settings)
    try:
        assert store.location == str(target)
    finally:
        await store.close()
    assert target.is_file() and not (tmp_path / "memory.db").exists()


def test_the_url_comes_from_the_environment_too(tmp_path: Path) -> None:
    target = tmp_path / "env.db"
    loaded = load_settings(env={"MEMORY_MCP_STORAGE_URL": f"sqlite://{target}"})
    assert loaded.settings.storage.url == f"sqlite://{target}"
    assert loaded.settings.database_path() == target


async def test_an_unreachable_postgres_server_is_a_storage_error_without_its_password(
    tmp_path: Path,
) -> None:
    url = "postgresql://memory:hunter2@127.0.0.1:1/memory?connect_timeout=2"
    with pytest.raises(StorageError, match="cannot connect") as caught:
        await open_store(with_url(url, tmp_path))
    assert "hunter2" not in str(caught.value) and "memory:***@127.0.0.1:1" in str(caught.value)


async def test_a_missing_postgres_driver_is_a_configuration_error_that_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError
    url = "postgresql://memory:hunter2@db.example:5432/memory"
    with pytest.raises(ConfigError, match=r"memory-mcp\[postgres\]") as caught:
        await open_store(with_url(url, tmp_path))
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("url", ["mongodb://host/db", "sqlite:", "sqlite://relative.db"])
async def test_an_unknown_scheme_or_a_sqlite_url_without_a_file_is_refused(
    url: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"storage\.url"):
        await open_store(with_url(url, tmp_path))


def test_a_url_is_shown_without_its_password() -> None:
    assert redacted("postgresql://u:p%40ss@h/db") == "postgresql://u:***@h/db"
    assert redacted("sqlite:///tmp/m.db") == "sqlite:///tmp/m.db"
