"""The OpenAI-compatible embedder against a small HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from memory_mcp.embedders.openai import OpenAIEmbedder
from memory_mcp.errors import EmbedderError


class EmbeddingsServer:
    """Answers POST /v1/embeddings with deterministic 8-dimensional vectors."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail_with: int | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                )
                if server.fail_with:
                    self.send_response(server.fail_with)
                    self.end_headers()
                    self.wfile.write(b"model not loaded")
                    return
                data = [
                    {"index": i, "embedding": [float(len(text)), 1.0, *([0.5] * 6)]}
                    for i, text in reversed(list(enumerate(body["input"])))
                ]
                payload = json.dumps({"object": "list", "data": data}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> EmbeddingsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[EmbeddingsServer]:
    with EmbeddingsServer() as running:
        yield running


def test_vectors_come_back_in_input_order_and_unit_length(server: EmbeddingsServer) -> None:
    embedder = OpenAIEmbedder(server.url, "nomic-embed-text", api_key="k-123", batch_size=2)
    vectors = embedder.embed(["a", "abc", "ab"])
    assert vectors.shape == (3, 8)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    raw_first = np.array([1.0, 1.0, *([0.5] * 6)])
    assert np.allclose(vectors[0], raw_first / np.linalg.norm(raw_first))
    assert embedder.name == "openai:nomic-embed-text"
    assert all(r["path"] == "/v1/embeddings" for r in server.requests)
    assert all(r["auth"] == "Bearer k-123" for r in server.requests)
    assert server.requests[0]["body"]["model"] == "nomic-embed-text"


def test_load_probes_the_endpoint_for_its_dimension(server: EmbeddingsServer) -> None:
    embedder = OpenAIEmbedder(server.url, "m")
    embedder.load()
    assert embedder.dim == 8


def test_an_error_answer_is_an_embedder_error_with_the_status(server: EmbeddingsServer) -> None:
    server.fail_with = 503
    with pytest.raises(EmbedderError, match="503"):
        OpenAIEmbedder(server.url, "m").embed(["x"])


def test_an_unreachable_endpoint_is_an_embedder_error() -> None:
    with pytest.raises(EmbedderError, match="failed"):
        OpenAIEmbedder("http://127.0.0.1:9/v1", "m", timeout=2).embed(["x"])


def test_missing_settings_are_named() -> None:
    with pytest.raises(EmbedderError, match="openai_model"):
        OpenAIEmbedder("http://127.0.0.1:9/v1", "")
