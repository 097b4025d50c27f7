"""The real embedding model (all-MiniLM-L6-v2), found once per test session."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from memory_mcp.embedders.fastembed import FastEmbedEmbedder

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
