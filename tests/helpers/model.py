"""The real embedding model (all-MiniLM-L6-v2), found once per test session."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from memory_mcp.embedders.fastembed import FastEmbedEmbedder
from memory_mcp.embedders.graph import copy_path, streamlined
from memory_mcp.embedders.onnx import model_file

REPO = Path(__file__).resolve().parents[2]
MODEL_ENV = "MEMORY_MCP_EMBEDDER_MODEL_PATH"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
SHARED = REPO.parent / "shared"


def local_model() -> str:
    """The model's folder when it is on this machine without a download (the variable,
    else ``../shared/models/``), for the processes a test starts; "" if it is not."""
    configured = os.environ.get(MODEL_ENV)
    if configured:
        return configured
    beside = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
    return str(beside) if (beside / "model.onnx").is_file() else ""


@functools.cache
def model_path() -> Path:
    """The real model's folder, found once per test session.

    ``$MEMORY_MCP_EMBEDDER_MODEL_PATH``, else ``../shared/models/`` beside the
    clone (CI), else fastembed's normal download into its cache. When none
    works (offline, no model), the whole run stops with one message saying how
    to provide it.
    """
    configured = os.environ.get(MODEL_ENV)
    if configured:
        if not (Path(configured) / "model.onnx").is_file():
            pytest.exit(f"{MODEL_ENV}={configured} holds no model.onnx; {_MODEL_HINT}", 1)
        return Path(configured)
    if found := local_model():
        return Path(found)
    try:
        offline = FastEmbedEmbedder(MODEL_NAME).can_download()  # seconds, not fastembed's retries
        if offline:
            raise RuntimeError(offline)
        from fastembed import TextEmbedding

        folder = Path(TextEmbedding(MODEL_NAME).model._model_dir)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        pytest.exit(
            f"the tests that need the real embedding model cannot get it: {MODEL_NAME} is not "
            f"on this machine and fastembed could not download it ({reason[:200]}). "
            f"{_MODEL_HINT}",
            1,
        )
    return folder


_MODEL_HINT = (
    f"Set {MODEL_ENV} to the folder of all-MiniLM-L6-v2's ONNX export (model.onnx, "
    "tokenizer.json), or run the tests once with network access so that fastembed can "
    "download it."
)


def seed_model_cache(cache: Path, model: Path | str | None = None) -> None:
    """Give a process whose cache folder (``cache_dir()``) is ``cache`` the streamlined
    copy of ``model`` (default: the real model's folder on this machine) that the test
    session made once, as a hard link: each process a test starts would otherwise make
    its own (about 2.5 s)."""
    found = local_model() if model is None else str(model)
    source = model_file(Path(found)) if found else None
    made = _session_copy(source) if source is not None else None
    target = copy_path(source, cache / "models") if source else None
    if made is None or target is None or target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # another filesystem: the process makes its own
        os.link(made, target)


@functools.cache
def _session_copy(source: Path) -> Path | None:
    folder = Path(tempfile.mkdtemp(prefix="memory-mcp-tests-model-"))
    atexit.register(shutil.rmtree, folder, True)
    return streamlined(source, folder)
