"""Embedders: fastembed (default), any OpenAI-compatible API, and the BM25 floor."""

from memory_mcp.embedders.base import Embedder, FakeEmbedder, Matrix
from memory_mcp.embedders.runtime import EmbedderStatus, Embeddings

__all__ = ["Embedder", "EmbedderStatus", "Embeddings", "FakeEmbedder", "Matrix"]
