"""Dense vectors from any OpenAI-compatible ``/v1/embeddings`` endpoint.

ollama, LM Studio, vLLM, llama.cpp's server and cloud APIs all speak this
contract: base URL + model + optional bearer key; nothing vendor-specific.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from memory_mcp.embedders.base import Matrix, length_batches, normalize_rows
from memory_mcp.errors import EmbedderError


class OpenAIEmbedder:
    """An OpenAI-compatible embeddings API behind the embedder seam."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "",
        timeout: float = 10.0,
        batch_size: int = 32,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not base_url:
            raise EmbedderError("embedder.openai_base_url is empty")
        if not model:
            raise EmbedderError("embedder.openai_model is empty; name the embedding model")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.batch_size = batch_size
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers, transport=transport)
        self._dim: int | None = None

    @property
    def name(self) -> str:
        return f"openai:{self.model}"

    @property
    def dim(self) -> int | None:
        return self._dim

    def locate(self) -> str:
        return self.base_url

    def can_download(self) -> str | None:
        return "an embeddings API has no model to download"

    def load(self, *, download: bool = False) -> None:
        if self._dim is None:
            self._dim = int(self._request(["probe"]).shape[1])

    def embed(self, texts: Sequence[str]) -> Matrix:
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        parts: dict[int, Matrix] = {}
        for batch in length_batches(texts, self.batch_size):
            vectors = self._request([texts[i] for i in batch])
            for row, index in enumerate(batch):
                parts[index] = vectors[row]
        out = np.stack([parts[i] for i in range(len(texts))])
        if self._dim is None:
            self._dim = int(out.shape[1])
        elif out.shape[1] != self._dim:
            raise EmbedderError(
                f"{self.base_url} returned {out.shape[1]}-dimensional vectors, expected {self._dim}"
            )
        return out

    def _request(self, inputs: list[str]) -> Matrix:
        url = f"{self.base_url}/embeddings"
        try:
            response = self._client.post(url, json={"model": self.model, "input": inputs})
        except httpx.HTTPError as exc:
            raise EmbedderError(f"embeddings request to {url} failed: {exc}") from exc
        if response.status_code != 200:
            raise EmbedderError(
                f"embeddings request to {url} answered {response.status_code}: "
                f"{response.text[:200]}"
            )
        try:
            payload: Any = response.json()
            items = sorted(payload["data"], key=lambda item: int(item.get("index", 0)))
            matrix = np.asarray([item["embedding"] for item in items], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbedderError(f"{url} answered with an unexpected body: {exc}") from exc
        if matrix.ndim != 2 or matrix.shape[0] != len(inputs):
            raise EmbedderError(
                f"{url} returned {matrix.shape[0] if matrix.ndim else 0} vectors "
                f"for {len(inputs)} inputs"
            )
        return normalize_rows(matrix)

    def close(self) -> None:
        self._client.close()
