"""Dense vectors from fastembed (ONNX on the CPU).

The model comes from a configured local folder, else fastembed's cache, else
(when allowed) a download. Inputs are cut to the model's trained window
(``max_tokens``; 256 for all-MiniLM-L6-v2): the export's tokenizer allows 512,
but the model never saw positions past 256 in training.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from memory_mcp.embedders.base import Matrix, length_batches, normalize_rows
from memory_mcp.errors import EmbedderError, ModelNotLocal

log = logging.getLogger(__name__)


class FastEmbedEmbedder:
    """A fastembed ``TextEmbedding`` behind the embedder seam."""

    def __init__(
        self,
        model: str,
        *,
        model_path: str = "",
        cache_dir: str = "",
        download: bool = True,
        threads: int = 0,
        max_tokens: int = 256,
        batch_size: int = 4,
    ) -> None:
        self.model = model
        self.model_path = model_path
        self.cache_dir = cache_dir
        self.download = download
        self.threads = threads
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self._impl: Any = None
        self._dim: int | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"fastembed:{self.model}"

    @property
    def dim(self) -> int | None:
        return self._dim

    def load(self, *, download: bool = False) -> None:
        with self._lock:
            if self._impl is None:
                self._impl = self._load(download=download and self.download)

    def _load(self, *, download: bool) -> Any:
        try:
            from fastembed import TextEmbedding
        except ImportError as exc:  # pragma: no cover - fastembed is a dependency
            raise EmbedderError(
                "fastembed is not installed; install memory-mcp with its dependencies "
                "(pip install memory-mcp) or set embedder.backend = 'bm25'"
            ) from exc
        _quiet_fastembed()
        _return_large_buffers()
        kwargs: dict[str, Any] = {"lazy_load": False, "enable_cpu_mem_arena": False}
        if self.threads:
            kwargs["threads"] = self.threads
        if self.cache_dir:
            kwargs["cache_dir"] = self.cache_dir
        if self.model_path:
            folder = Path(self.model_path).expanduser()
            if not (folder / "model.onnx").is_file() and not any(folder.glob("*.onnx")):
                raise EmbedderError(
                    f"embedder.model_path {folder} holds no ONNX model (model.onnx); point it "
                    "at the folder of the model's ONNX export"
                )
            kwargs["specific_model_path"] = str(folder)
        else:
            kwargs["local_files_only"] = not download
        try:
            with _no_spinning():
                impl = TextEmbedding(self.model, **kwargs)
        except Exception as exc:
            if self.model_path:
                raise EmbedderError(
                    f"cannot load {self.model} from {self.model_path}: {exc}"
                ) from exc
            if not download:
                hint = "downloading it" if self.download else "set embedder.model_path"
                raise ModelNotLocal(f"{self.model} is not in fastembed's cache ({hint})") from exc
            raise EmbedderError(f"cannot download {self.model}: {exc}") from exc
        tokenizer = getattr(getattr(impl, "model", None), "tokenizer", None)
        if tokenizer is not None:
            tokenizer.enable_truncation(max_length=self.max_tokens)
        else:  # pragma: no cover - depends on fastembed internals
            log.warning(
                "cannot limit %s to %d tokens; using its own limit", self.model, self.max_tokens
            )
        probe = np.asarray(list(impl.embed(["probe"])), dtype=np.float32)
        self._dim = int(probe.shape[1])
        return impl

    def embed(self, texts: Sequence[str]) -> Matrix:
        if self._impl is None:
            self.load()
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        out = np.zeros((len(texts), self._dim or 0), dtype=np.float32)
        for batch in length_batches(texts, self.batch_size):
            vectors = list(self._impl.embed([texts[i] for i in batch], batch_size=len(batch)))
            out[batch] = np.asarray(vectors, dtype=np.float32)
        return normalize_rows(out)


@contextmanager
def _no_spinning() -> Iterator[None]:
    """Sessions made meanwhile put their idle threads to sleep instead of spinning.

    onnxruntime's threads spin-wait after each run by default, holding a core
    the vector search that follows a store's embedding wants: scoring 108,834
    rows on two threads took 13.7 ms right after an embedding instead of 7.4,
    and a query's embedding cost 57.8 ms of CPU time instead of 10.3 (on a
    machine that several agents' servers share). Embedding is as fast without
    it (12.3 vs 12.4 ms a passage). fastembed builds its own SessionOptions, so
    the class is swapped while it does.
    """
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - fastembed depends on it
        yield
        return
    with _PATCH_LOCK:  # embedders may load in several threads at once
        original = ort.SessionOptions

        class _Quiet(original):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.add_session_config_entry("session.intra_op.allow_spinning", "0")
                self.add_session_config_entry("session.inter_op.allow_spinning", "0")

        ort.SessionOptions = _Quiet
        try:
            yield
        finally:
            ort.SessionOptions = original


_PATCH_LOCK = threading.Lock()


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_MMAP_THRESHOLD = 256 * 1024


def _return_large_buffers() -> None:
    """Have glibc give inference buffers back to the system when they are freed.

    A batch of long texts needs tens of MB of activations. glibc raises its
    mmap threshold each time such a buffer is freed, so later ones come from the
    heap, which it does not shrink: resident memory ratcheted up to the largest
    batch ever seen (234 MB after loading, 603 MB after embedding long texts).
    A fixed threshold keeps large buffers in their own mappings, unmapped on
    free. Elsewhere (macOS, Windows, musl) this does nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


def _quiet_fastembed() -> None:
    """fastembed logs download retries through loguru; the runtime reports them once."""
    try:
        from loguru import logger
    except ImportError:  # pragma: no cover - loguru comes with fastembed
        return
    logger.disable("fastembed")
