"""Dense vectors from a fastembed model (ONNX on the CPU).

The model comes from a configured local folder, else the folder fastembed
downloaded it to earlier, else fastembed's cache, else (when allowed) a
download. A model whose folder is known and whose preprocessing ``onnx.py``
reproduces runs directly on onnxruntime, without importing fastembed (0.7-0.9 s
of imports); the folder fastembed resolves is remembered for the next start
(``<cache>/models.json``). Inputs are cut to the model's trained window
(``max_tokens``; 256 for all-MiniLM-L6-v2): the export's tokenizer allows 512,
but the model never saw positions past 256 in training.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from memory_mcp.config import BOOLEAN_WORDS
from memory_mcp.dirs import cache_dir
from memory_mcp.embedders.base import INT8_MARK, Matrix, length_batches, normalize_rows
from memory_mcp.embedders.onnx import MEAN_POOLED, OnnxModel, model_file, quiet_sessions
from memory_mcp.errors import EmbedderError, ModelNotLocal

log = logging.getLogger(__name__)

FOLDERS_FILE = "models.json"
HINT = (
    "set embedder.model_path (MEMORY_MCP_EMBEDDER_MODEL_PATH) to the folder of the model's "
    "ONNX export (model.onnx, tokenizer.json), or embedder.backend = 'bm25' for lexical search "
    "only"
)


class FastEmbedEmbedder:
    """A fastembed model behind the embedder seam."""

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
        quantize: bool = False,
    ) -> None:
        self.model = model
        self.quantize = quantize
        self.model_path = model_path
        self.cache_dir = cache_dir
        self.download = download
        self.threads = threads
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self._direct: OnnxModel | None = None
        self._impl: Any = None  # a fastembed TextEmbedding, for models run through fastembed
        self._dim: int | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        # An int8 copy's vectors are not the model's: they never share an index.
        return f"fastembed:{self.model}{INT8_MARK if self.quantize else ''}"

    @property
    def dim(self) -> int | None:
        return self._dim

    def locate(self) -> str:
        """Where the model would load from, without loading it.

        Raises:
            EmbedderError: the configured folder holds no model.
            ModelNotLocal: the model is not on this machine.
        """
        folder = self._folder()
        if folder is not None:
            return str(folder)
        raise self._not_local()

    def can_download(self) -> str | None:
        """Why a download cannot work now, or None when it may.

        fastembed retries an unreachable host for about 40 s before it gives up;
        a machine without network learns that at once here (a 2 s connection).
        """
        if not self.download:
            return "downloads are off (embedder.download = false)"
        if BOOLEAN_WORDS.get(os.environ.get("HF_HUB_OFFLINE", "").strip().casefold()):
            return "HF_HUB_OFFLINE is set"
        if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
            return None  # through a proxy: only the download itself can tell
        host = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
        port = host.port or (80 if host.scheme == "http" else 443)
        try:
            with socket.create_connection((host.hostname or "", port), timeout=2):
                return None
        except OSError as exc:
            return f"{host.hostname} cannot be reached ({exc.strerror or exc})"

    def load(self, *, download: bool = False) -> None:
        with self._lock:
            if self._direct is not None or self._impl is not None:
                return
            _return_large_buffers()
            folder = self._folder()
            if self.quantize:
                if self.model not in MEAN_POOLED:
                    raise EmbedderError(
                        f"embedder.quantize runs {', '.join(sorted(MEAN_POOLED))} only, not "
                        f"{self.model}; set it to false"
                    )
                if folder is None:  # fastembed fetches the files the int8 copy is made from
                    impl = self._load_fastembed(None, download=download and self.download)
                    found = getattr(getattr(impl, "model", None), "_model_dir", None)
                    folder = self._folder() or (Path(found) if found else None)
                    if folder is None:
                        raise EmbedderError(f"cannot find where fastembed put {self.model}")
            if folder is not None and self.model in MEAN_POOLED:
                try:
                    self._direct = OnnxModel(
                        folder,
                        max_tokens=self.max_tokens,
                        threads=self.threads,
                        cache=cache_dir() / "models",
                        int8=self.quantize,
                    )
                except Exception as exc:
                    raise EmbedderError(f"cannot load {self.model} from {folder}: {exc}") from exc
            else:
                self._impl = self._load_fastembed(folder, download=download and self.download)
            self._dim = int(self.embed(["probe"]).shape[1])

    def _folder(self) -> Path | None:
        """The model's folder: the configured one, else where fastembed put it before."""
        if self.model_path:
            folder = Path(self.model_path).expanduser()
            if model_file(folder) is None:
                raise EmbedderError(
                    f"embedder.model_path {folder} holds no ONNX model (model.onnx); point it "
                    "at the folder of the model's ONNX export"
                )
            return folder
        remembered = _remembered().get(self._key())
        if remembered and model_file(Path(remembered)) is not None:
            return Path(remembered)
        return None

    def _key(self) -> str:
        return f"{self.model}|{os.path.abspath(self.cache_dir) if self.cache_dir else ''}"

    def _not_local(self) -> ModelNotLocal:
        where = f" ({self.cache_dir})" if self.cache_dir else ""
        return ModelNotLocal(
            f"{self.model} is not on this machine (not in fastembed's cache{where})", hint=HINT
        )

    def _load_fastembed(self, folder: Path | None, *, download: bool) -> Any:
        try:
            from fastembed import TextEmbedding
        except ImportError as exc:  # pragma: no cover - fastembed is a dependency
            raise EmbedderError(
                "fastembed is not installed; install memory-mcp with its dependencies "
                "(pip install memory-mcp) or set embedder.backend = 'bm25'"
            ) from exc
        _quiet_fastembed()
        kwargs: dict[str, Any] = {"lazy_load": False, "enable_cpu_mem_arena": False}
        if self.threads:
            kwargs["threads"] = self.threads
        if self.cache_dir:
            kwargs["cache_dir"] = self.cache_dir
        if folder is not None:
            kwargs["specific_model_path"] = str(folder)
        else:
            kwargs["local_files_only"] = not download
        try:
            with quiet_sessions():
                impl = TextEmbedding(self.model, **kwargs)
        except Exception as exc:
            if folder is not None:
                raise EmbedderError(f"cannot load {self.model} from {folder}: {exc}") from exc
            if not download:
                raise self._not_local() from exc
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EmbedderError(f"{self.model} could not be downloaded ({first[:200]})") from exc
        tokenizer = getattr(getattr(impl, "model", None), "tokenizer", None)
        if tokenizer is not None:
            tokenizer.enable_truncation(max_length=self.max_tokens)
        else:  # pragma: no cover - depends on fastembed internals
            log.warning(
                "cannot limit %s to %d tokens; using its own limit", self.model, self.max_tokens
            )
        found = getattr(getattr(impl, "model", None), "_model_dir", None)
        if folder is None and found is not None:
            _remember(self._key(), str(found))
        return impl

    def embed(self, texts: Sequence[str]) -> Matrix:
        import numpy as np

        if self._direct is None and self._impl is None:
            self.load()
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        if self._direct is not None:
            return self._direct.embed(texts, batch_size=self.batch_size)
        out = np.zeros((len(texts), self._dim or 0), dtype=np.float32)
        for batch in length_batches(texts, self.batch_size):
            vectors = list(self._impl.embed([texts[i] for i in batch], batch_size=len(batch)))
            if out.shape[1] == 0:
                out = np.zeros((len(texts), len(vectors[0])), dtype=np.float32)
            out[batch] = np.asarray(vectors, dtype=np.float32)
        return normalize_rows(out)


def _remembered() -> dict[str, str]:
    try:
        data = json.loads((cache_dir() / FOLDERS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def _remember(key: str, folder: str) -> None:
    """Note where fastembed keeps a model, so that the next start finds it at once."""
    known = _remembered()
    if known.get(key) == folder:
        return
    known[key] = folder
    path = cache_dir() / FOLDERS_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(known, indent=2), encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        log.info("could not remember where %s is", key, exc_info=True)


_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 256 * 1024
_TRIM_THRESHOLD = 1024 * 1024


def _return_large_buffers() -> None:
    """Have glibc give inference buffers back to the system when they are freed.

    A batch of long texts needs tens of MB of activations. glibc raises its
    mmap threshold each time such a buffer is freed, so later ones come from the
    heap, which it does not shrink: resident memory ratcheted up to the largest
    batch ever seen (234 MB after loading, 603 MB after embedding long texts).
    A fixed threshold keeps large buffers in their own mappings, unmapped on
    free. Elsewhere (macOS, Windows, musl) this does nothing.

    Fixing it fixes the heap's trim threshold too, at glibc's 128 KB: each time
    the free space at the top of the heap passed that, it went back to the
    system, and the next buffers there were faulted in again page by page: 660-830
    page faults a search at 200,000 memories, 400 at 50,000, 120 a store. With 1
    MB kept: 310-360, 140 and 40; search p50 -0.5 to -0.95 ms at 200,000 and
    -0.57 at 50,000, store mean -0.2 ms (each pair alternating in one process),
    resident memory 1 MB more at most.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)


def _quiet_fastembed() -> None:
    """fastembed logs download retries through loguru; the runtime reports them once."""
    try:
        from loguru import logger
    except ImportError:  # pragma: no cover - loguru comes with fastembed
        return
    logger.disable("fastembed")
