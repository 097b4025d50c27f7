"""Which embedder is in use, loading it without blocking, and degrading loudly.

Availability tiering (SPEC §6): ``auto`` takes the best embedder present (an
OpenAI-compatible endpoint when one is configured, else fastembed), with the
BM25 floor (no vectors, lexical search) always there. Upgrade-only: a store
that already holds dense vectors keeps that embedder's identity; when it is
unreachable, searches answer lexically with a warning and writes wait for the
re-embed, until it comes back. Only an explicit ``embedder.backend`` switches a
store from one dense embedder to another (the re-embed job then converges).

Loading runs in a daemon thread so that neither the MCP handshake nor a CLI
process's exit waits for a model download.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import anyio

from memory_mcp.config import EmbedderSettings
from memory_mcp.embedders.base import INT8_MARK, Embedder, Matrix
from memory_mcp.errors import EmbedderError, ModelNotLocal

log = logging.getLogger(__name__)

State = Literal["off", "available", "loading", "ready", "unavailable"]
_FIRST_RETRY_S = 30.0
_MAX_RETRY_S = 900.0


@dataclass(frozen=True)
class EmbedderStatus:
    """What ``status`` reports about embedding."""

    configured: str  # the backend setting
    effective: str  # the embedder making vectors now, or "bm25" (lexical floor)
    identity: str | None  # the embedder whose vectors this store searches
    state: State
    degraded: bool
    reason: str


_PRELOADED: dict[str, list[Embedder]] = {}


def preload(settings: EmbedderSettings) -> None:
    """Start loading the best embedder the settings point at, in a background thread.

    ``serve`` calls this before it imports the MCP SDK (about half a second), so
    that the model loads meanwhile; the ``Embeddings`` made later for the same
    settings get the same candidates (``build_candidates``), whose ``load`` then
    waits for this one instead of starting again. Only a model already on this
    machine is loaded here; anything else is left to ``Embeddings``.
    """
    try:
        candidates = build_candidates(settings)
    except EmbedderError:
        return
    _PRELOADED[_key(settings)] = candidates
    if candidates:
        first = candidates[0]

        def load() -> None:
            with contextlib.suppress(Exception):  # Embeddings will try again and report it
                first.load(download=False)

        threading.Thread(target=load, name="embedder-preload", daemon=True).start()


def _key(settings: EmbedderSettings) -> str:
    return repr(settings)


def build_candidates(settings: EmbedderSettings) -> list[Embedder]:
    """The dense embedders the settings point at, best first (the preloaded ones, if any)."""
    if (preloaded := _PRELOADED.pop(_key(settings), None)) is not None:
        return preloaded
    candidates: list[Embedder] = []
    wants_openai = settings.backend == "openai" or (
        settings.backend == "auto" and bool(settings.openai_base_url)
    )
    if wants_openai:
        from memory_mcp.embedders.openai import OpenAIEmbedder

        try:
            candidates.append(
                OpenAIEmbedder(
                    settings.openai_base_url,
                    settings.openai_model,
                    api_key=settings.openai_api_key,
                    timeout=settings.openai_timeout,
                    batch_size=settings.batch_size,
                )
            )
        except EmbedderError as exc:
            if settings.backend == "openai":
                raise
            log.warning("ignoring the OpenAI-compatible embedder: %s", exc)
    if settings.backend in ("auto", "fastembed"):
        from memory_mcp.embedders.fastembed import FastEmbedEmbedder

        candidates.append(
            FastEmbedEmbedder(
                settings.model,
                model_path=settings.model_path,
                cache_dir=settings.cache_dir,
                download=settings.download,
                threads=settings.threads,
                max_tokens=settings.max_tokens,
                batch_size=settings.batch_size,
                quantize=settings.quantize,
            )
        )
    return candidates


def _base(name: str) -> str:
    """An embedder's name without its int8 mark: the model whose copy it runs."""
    return name.removesuffix(INT8_MARK)


def _reasons(errors: Sequence[str], hints: Sequence[str] = (), *, then: str = "") -> str:
    """Why loading failed (a candidate tried twice, cache then download, fails once),
    ``then`` what happens meanwhile, then how to provide a model that is missing."""
    provide = "".join(f". To provide it: {hint}" for hint in dict.fromkeys(hints))
    return "; ".join(dict.fromkeys(errors)) + then + provide


def _download(blocked: str | None) -> str:
    """What becomes of a model that is not on this machine: ``blocked`` says why it
    cannot be downloaded now, if it cannot."""
    if blocked is None:
        return "the first command or server that needs it downloads it"
    return f"it cannot be downloaded: {blocked}"


class Embeddings:
    """The embedder in use and its state; vectors or ``None`` (lexical floor)."""

    def __init__(
        self,
        settings: EmbedderSettings,
        *,
        candidates: Sequence[Embedder] | None = None,
    ) -> None:
        self.settings = settings
        self._candidates = list(candidates) if candidates is not None else None
        self._embedder: Embedder | None = None
        self._identity: str | None = None
        self._state: State = "off"
        self._reason = "embedder.backend is bm25: lexical search only"
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self._retry_at = 0.0
        self._retry_s = _FIRST_RETRY_S
        self._loader: threading.Thread | None = None
        self._pending: list[Embedder] = []
        self._located = ""
        self._limiter = anyio.CapacityLimiter(1)

    # Start-up ------------------------------------------------------------------------

    def start(self, held: dict[str, int], *, load: bool = True, probe: bool = False) -> None:
        """Decide the identity from the settings and the store's vectors; start loading.

        Args:
            held: embedder names that already have vectors in the store, with counts.
            load: False only finds where the model would load from (work that embeds
                nothing, such as the brief, answers at once).
            probe: without ``load``, also check whether a model that is not on this
                machine could be downloaded now (``status``; a 2 s connection at most).
        """
        candidates = (
            self._candidates if self._candidates is not None else build_candidates(self.settings)
        )
        intent = max(held, key=lambda name: held[name]) if held else None
        if not candidates:
            self._state = "off"
            self._settled.set()
            if intent:
                self._reason = (
                    f"embedder.backend is bm25: the {held[intent]} vectors of {intent} in this "
                    "store are not used"
                )
            return
        chosen: list[Embedder]
        if self.settings.backend == "auto" and intent is not None:
            matching = [c for c in candidates if c.name == intent]
            self._identity = intent
            if not matching:
                self._state = "unavailable"
                self._reason = (
                    f"this store's vectors come from {intent}, which is not configured; "
                    "searching lexically. Configure it again, or set embedder.backend "
                    "explicitly to re-embed with another model"
                )
                if any(_base(c.name) == _base(intent) for c in candidates):
                    made = "with" if intent != _base(intent) else "without"
                    self._reason += (
                        f" (embedder.quantize is {'on' if self.settings.quantize else 'off'}; "
                        f"they were made {made} it)"
                    )
                log.warning("embedder degraded: %s", self._reason)
                self._settled.set()
                return
            chosen = matching
        else:
            chosen = candidates
            self._identity = candidates[0].name if self.settings.backend != "auto" else None
        self._pending = chosen
        if load:
            self._begin_loading()
        else:
            self._locate(probe)

    def _locate(self, probe: bool) -> None:
        """Find the first candidate that could load, without loading it."""
        errors: list[str] = []
        hints: list[str] = []
        for candidate in self._pending:
            try:
                where = candidate.locate()
            except ModelNotLocal as exc:
                blocked = candidate.can_download() if probe else None
                errors += [str(exc), _download(blocked)]
                hints += [exc.hint] if exc.hint else []
                continue
            except EmbedderError as exc:
                errors.append(str(exc))
                continue
            self._state = "available"
            self._identity = self._identity or candidate.name
            self._located = candidate.name
            self._reason = f"not loaded by this command; loads from {where}"
            self._settled.set()
            return
        self._state = "unavailable"
        self._reason = _reasons(errors, hints)
        self._settled.set()

    def _begin_loading(self) -> None:
        with self._lock:
            if self._loader is not None and self._loader.is_alive():
                return
            self._state = "loading"
            self._reason = "loading " + " / ".join(c.name for c in self._pending)
            self._loader = threading.Thread(target=self._load, name="embedder-load", daemon=True)
            self._loader.start()

    def _load(self) -> None:
        errors: list[str] = []
        hints: list[str] = []
        fetchable: list[Embedder] = []
        for candidate in self._pending:
            outcome = self._try(candidate, download=False, errors=errors, hints=hints)
            if outcome == "ready":
                return
            if outcome == "not-local":
                if (blocked := candidate.can_download()) is None:
                    fetchable.append(candidate)
                else:
                    errors.append(_download(blocked))
        if fetchable:
            # The first attempt has settled: callers go on lexically while it downloads.
            with self._lock:
                names = " / ".join(c.name for c in fetchable)
                self._reason = f"downloading {names}; searching lexically until it arrives"
            self._settled.set()
            for candidate in fetchable:
                if self._try(candidate, download=True, errors=errors, hints=hints) == "ready":
                    return
        with self._lock:
            self._state = "unavailable"
            self._reason = _reasons(
                errors, hints, then="; searching lexically until it is available"
            )
            self._retry_at = time.monotonic() + self._retry_s
            self._retry_s = min(self._retry_s * 2, _MAX_RETRY_S)
        log.warning("embedder unavailable: %s", self._reason)
        self._settled.set()

    def _try(
        self, candidate: Embedder, *, download: bool, errors: list[str], hints: list[str]
    ) -> Literal["ready", "not-local", "failed"]:
        """Load one candidate; on success make it the embedder in use."""
        try:
            candidate.load(download=download)
        except ModelNotLocal as exc:
            errors.append(str(exc))
            if exc.hint:
                hints.append(exc.hint)
            return "not-local"
        except EmbedderError as exc:
            errors.append(str(exc))
            return "failed"
        except Exception as exc:  # a broken model file must not take the server down
            errors.append(f"{candidate.name}: {exc!r}")
            return "failed"
        with self._lock:
            self._embedder = candidate
            self._identity = candidate.name
            self._state = "ready"
            self._reason = ""
            self._retry_s = _FIRST_RETRY_S
        log.info("embedder ready: %s (%s dimensions)", candidate.name, candidate.dim)
        self._settled.set()
        return "ready"

    async def wait_settled(self, seconds: float) -> bool:
        """Wait (bounded) until the first load attempt has succeeded or failed.

        A model that is not on disk settles at once (callers go on lexically)
        while it downloads; ``wait_loaded`` waits for the download too.
        """
        # abandon_on_cancel: a server shutting down must not wait for a slow load
        return await anyio.to_thread.run_sync(self._settled.wait, seconds, abandon_on_cancel=True)

    async def settle(self) -> None:
        """Wait for a model that is loading from disk, at most ``embedder.load_wait_seconds``.

        Searches and stores call this first, so that the first ones of a session
        get the model instead of the lexical floor (it loads in about a second;
        a download does not count: the first load attempt settles at once when
        the model is not on disk).
        """
        if self._state == "loading" and not self._settled.is_set():
            await self.wait_settled(self.settings.load_wait_seconds)

    async def wait_loaded(self, seconds: float) -> bool:
        """Wait (bounded) until loading has finished, downloads included; True if ready.

        For work that is pointless without vectors (re-embedding, benchmarks).
        """
        loader = self._loader
        if loader is not None:
            await anyio.to_thread.run_sync(loader.join, seconds)
        return self.ready

    # Use -----------------------------------------------------------------------------

    @property
    def identity(self) -> str | None:
        """The embedder whose vectors this store searches and writes (None: lexical only)."""
        return self._identity

    @property
    def ready(self) -> bool:
        return self._state == "ready"

    async def embed(self, texts: Sequence[str]) -> Matrix | None:
        """Vectors for ``texts`` from the identity embedder, or None (use the lexical floor)."""
        embedder = self._embedder
        if embedder is None or self._state != "ready":
            self._maybe_retry()
            return None
        try:
            return await anyio.to_thread.run_sync(
                embedder.embed, list(texts), limiter=self._limiter
            )
        except EmbedderError as exc:
            with self._lock:
                self._state = "unavailable"
                self._reason = f"{exc}; searching lexically until it answers again"
                self._retry_at = time.monotonic() + self._retry_s
                self._retry_s = min(self._retry_s * 2, _MAX_RETRY_S)
            log.warning("embedder degraded: %s", self._reason)
            return None

    def _maybe_retry(self) -> None:
        if self._state != "unavailable" or not self._pending:
            return
        if time.monotonic() >= self._retry_at:
            self._begin_loading()

    def status(self) -> EmbedderStatus:
        with self._lock:
            effective = self._embedder.name if self._state == "ready" and self._embedder else "bm25"
            if self._state == "available":
                effective = self._located
            degraded = self._state in ("unavailable", "loading") or (
                self._state == "off" and "not used" in self._reason
            )
            return EmbedderStatus(
                configured=self.settings.backend,
                effective=effective,
                identity=self._identity,
                state=self._state,
                degraded=degraded,
                reason=self._reason,
            )
