"""A sentence-transformers ONNX export run directly: ``tokenizers`` + ``onnxruntime``.

fastembed finds and downloads models; running one needs only its tokenizer and
an ONNX session. Importing fastembed costs 0.7-0.9 s on a small machine (it
brings huggingface_hub, requests, PIL and its image models), more than loading
the model itself (onnxruntime 0.2 s, the session 0.12 s, the tokenizer 0.01 s),
and every searching CLI command and every server start pays for it. So a model
whose files are on disk runs here, with fastembed's own preprocessing for these
models: its tokenizer settings (truncation, batch-longest padding, special
tokens), mean pooling over the attention mask in float64, then L2
normalization. ``tests/embedders/test_onnx.py`` holds the vectors to
fastembed's.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memory_mcp.embedders.base import Matrix, length_batches
from memory_mcp.embedders.sessions import quiet, session_options
from memory_mcp.errors import EmbedderError

if TYPE_CHECKING:
    import onnxruntime as ort

log = logging.getLogger(__name__)

# Models fastembed runs with mean pooling and normalization (its "pooled normalized"
# family) that this runner has been checked against; others load through fastembed.
MEAN_POOLED = frozenset({"sentence-transformers/all-MiniLM-L6-v2"})
MODEL_FILES = ("model.onnx", "onnx/model.onnx")


def model_file(folder: Path) -> Path | None:
    """The ONNX file of a model folder, if it has one."""
    for name in MODEL_FILES:
        if (folder / name).is_file():
            return folder / name
    return next(iter(sorted(folder.glob("*.onnx"))), None)


class OnnxModel:
    """One model folder (``model.onnx``, ``tokenizer.json``, ...) ready to embed."""

    def __init__(
        self,
        folder: Path,
        *,
        max_tokens: int,
        threads: int = 0,
        cache: Path | None = None,
        int8: bool = False,
    ) -> None:
        """``cache``: where the streamlined copy of the model's graph is kept
        (``graph.streamlined``); None: the graph runs as it is. ``int8``: run the
        copy with 8-bit weights instead (``graph.quantized``, kept in ``cache``)."""
        import onnxruntime as ort

        source = model_file(folder)
        if source is None:
            raise EmbedderError(f"{folder} holds no ONNX model (model.onnx)")
        copy = None
        if int8:
            from memory_mcp.embedders.graph import quantized

            if cache is None:
                raise EmbedderError("an int8 copy of the model needs a cache folder")
            copy, why = quantized(source, cache)
            if copy is None:
                raise EmbedderError(f"cannot make an int8 copy of {source}: {why}")
        elif cache is not None:
            from memory_mcp.embedders.graph import streamlined

            copy = streamlined(source, cache)
        self.tokenizer = _tokenizer(folder, max_tokens)
        options = session_options(threads)

        def session(path: Path) -> ort.InferenceSession:
            return ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )

        self.path = copy or source  # the graph it runs
        try:
            self.session = session(self.path)
        except Exception:
            if copy is None:
                raise
            if int8:  # the exported graph is not what was asked: made again next load
                copy.unlink(missing_ok=True)
                raise
            # A damaged copy (cut short, or one a newer onnxruntime refuses): the model
            # runs as exported, and the next load makes the copy again.
            log.warning("cannot load %s; running %s as exported", copy, source, exc_info=True)
            copy.unlink(missing_ok=True)
            self.path = source
            self.session = session(source)
        self._inputs = {node.name for node in self.session.get_inputs()}
        self._lock = threading.Lock()
        # The int8 copy quantizes each run's activations with one scale for the whole
        # batch, so a text's vector would depend on the texts beside it (cosine 0.98-0.99
        # between a text alone and in a batch of 4): it embeds one text per run.
        self._one_per_run = int8

    def embed(self, texts: Sequence[str], *, batch_size: int) -> Matrix:
        """Unit vectors for ``texts``, in order, ``batch_size`` texts per model run."""
        import numpy as np

        rows: dict[int, Matrix] = {}
        for batch in length_batches(texts, 1 if self._one_per_run else batch_size):
            rows.update(zip(batch, self._run([texts[i] for i in batch]), strict=True))
        return np.stack([rows[i] for i in range(len(texts))])

    def _run(self, texts: list[str]) -> Matrix:
        import numpy as np

        encoded = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        feed: dict[str, Any] = {"input_ids": ids}
        if "attention_mask" in self._inputs:
            feed["attention_mask"] = mask
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        with self._lock:
            hidden = self.session.run(None, feed)[0]
        summed = np.sum(hidden, axis=1, where=mask[:, :, np.newaxis].astype(bool), dtype=np.float64)
        pooled = summed / np.maximum(np.sum(mask, axis=1, keepdims=True), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        out: Matrix = (pooled / norms).astype(np.float32)
        return out


def _tokenizer(folder: Path, max_tokens: int) -> Any:
    """The folder's tokenizer, set up as fastembed sets it up, cut at ``max_tokens``."""
    from tokenizers import AddedToken, Tokenizer

    def read(name: str) -> dict[str, Any]:
        path = folder / name
        if not path.is_file():
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}

    if not (folder / "tokenizer.json").is_file():
        raise EmbedderError(f"{folder} holds no tokenizer.json")
    config, tokenizer_config = read("config.json"), read("tokenizer_config.json")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    limits = [
        int(value)
        for value in (tokenizer_config.get("model_max_length"), tokenizer_config.get("max_length"))
        if isinstance(value, int) and 0 < value < 1_000_000
    ]
    truncation = tokenizer.truncation or {}
    tokenizer.enable_truncation(
        max_length=min([max_tokens, *limits]),
        direction=tokenizer_config.get("truncation_side") or truncation.get("direction", "right"),
    )
    for value in read("special_tokens_map.json").values():
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, str):
                tokenizer.add_special_tokens([token])
            elif isinstance(token, dict):
                tokenizer.add_special_tokens([AddedToken(**token)])
    padding = tokenizer.padding or {}
    pad_token = padding.get("pad_token") or tokenizer_config.get("pad_token")
    if not isinstance(pad_token, str):
        raise EmbedderError(f"{folder}: the tokenizer names no pad token")
    pad_id = padding.get("pad_id", config.get("pad_token_id"))
    if pad_id is None:
        pad_id = tokenizer.token_to_id(pad_token)
    if pad_id is None:
        raise EmbedderError(f"{folder}: the pad token {pad_token!r} has no id")
    tokenizer.enable_padding(
        direction=tokenizer_config.get("padding_side") or padding.get("direction", "right"),
        pad_id=pad_id,
        pad_type_id=padding.get("pad_type_id", 0),
        pad_token=pad_token,
        pad_to_multiple_of=padding.get("pad_to_multiple_of"),
        length=None,
    )
    return tokenizer


@contextmanager
def quiet_sessions() -> Iterator[None]:
    """Sessions fastembed makes meanwhile get ``quiet`` options too.

    fastembed builds its own SessionOptions, so the class is swapped while it does.
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
                quiet(self)

        ort.SessionOptions = _Quiet
        try:
            yield
        finally:
            ort.SessionOptions = original


_PATCH_LOCK = threading.Lock()
