"""Fake model servers for the agent CLIs: one per API, scripted, capturing every request.

Each server listens on 127.0.0.1 (an ephemeral port) and speaks just enough of
one API for a CLI to run an agent loop against it:

- ``AnthropicMessages``: Claude Code, through ``ANTHROPIC_BASE_URL``
  (``POST /v1/messages``, streamed as the Messages API's server-sent events);
- ``OpenAIResponses``: Codex, through a ``[model_providers.<id>]`` with
  ``wire_api = "responses"`` (``POST <base_url>/responses``, streamed);
- ``GeminiApi``: Gemini CLI, through ``GOOGLE_GEMINI_BASE_URL``
  (``POST /v1beta/models/<model>:streamGenerateContent?alt=sse``, and the
  unstreamed ``:generateContent`` its helpers use).

A *script* is the list of turns the model plays in the agent loop: call a tool
(``ToolCall``) or answer (``Answer``). Only requests of the agent loop — those
that offer the model tools — take the next turn; a CLI's side requests (a
session title, say) get a short answer and take none. Once the script is
played out every agent request gets a final answer, so a session always ends.
``expect(script)`` starts a session's ``Transcript``, which keeps every request
in order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

DONE = "Done."


@dataclass(frozen=True)
class ToolCall:
    """The model calls ``name`` (as the CLI names the tool to the model) with ``arguments``.

    ``namespace``: the group the tool is offered in, for APIs that group tools
    (Codex offers a server's tools in a ``namespace`` tool, ``mcp__<server>``).
    """

    name: str
    arguments: dict[str, Any]
    namespace: str | None = None

    @property
    def qualified(self) -> str:
        """The name as ``tool_names`` lists it: ``namespace/name``, or just ``name``."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class Answer:
    """The model answers ``text`` and ends its turn."""

    text: str


Turn = ToolCall | Answer


@dataclass
class Request:
    """One request a CLI sent, as received."""

    method: str
    path: str
    headers: dict[str, str]
    raw: str
    body: Any
    agent: bool = False  # part of the agent loop (it offered tools), so it took a turn
    turn: Turn | None = None

    def mentions(self, text: str) -> int:
        """How often ``text`` occurs in the request's decoded strings."""
        return sum(value.count(text) for value in strings(self.body))


def texts(content: Any) -> str:
    """The text of a tool result's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            texts(part.get("text", "")) if isinstance(part, dict) else texts(part)
            for part in content
        )
    return ""


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys excluded."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


@dataclass
class Reply:
    status: int
    content_type: str
    body: bytes


def sse(events: list[tuple[str | None, Any]]) -> bytes:
    """A server-sent event stream: ``event:`` lines (when named) and JSON ``data:``."""
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        out.append(f"{head}data: {json.dumps(data)}\n\n")
    return "".join(out).encode("utf-8")


def json_reply(data: Any, status: int = 200) -> Reply:
    return Reply(status, "application/json", json.dumps(data).encode("utf-8"))


@dataclass
class Transcript:
    """One session against a fake model: its script and every request the CLI sent."""

    script: list[Turn]
    requests: list[Request] = field(default_factory=list)
    played: int = 0  # turns of the script taken so far

    @property
    def agent_requests(self) -> list[Request]:
        return [r for r in self.requests if r.agent]

    @property
    def played_out(self) -> bool:
        return self.played >= len(self.script)


class FakeModel:
    """A scripted model server; subclasses speak one API.

    The server keeps its port for its whole life (a CLI's configuration may
    name it); ``expect`` starts a new transcript for each session.
    """

    def __init__(self) -> None:
        self.transcript = Transcript([])
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def expect(self, script: list[Turn]) -> Transcript:
        """Play ``script`` to the next session, and keep its requests in a new transcript."""
        with self._lock:
            self.transcript = Transcript(list(script))
            return self.transcript

    # The API, per subclass -------------------------------------------------------------

    def offers_tools(self, request: Request) -> bool:
        raise NotImplementedError

    def play(self, request: Request, turn: Turn) -> Reply:
        raise NotImplementedError

    def aside(self, request: Request) -> Reply:
        """The answer to a request outside the agent loop."""
        raise NotImplementedError

    def tool_names(self, request: Request) -> list[str]:
        """The names of the tools a request offers the model."""
        raise NotImplementedError

    def tool_results(self, request: Request) -> list[str]:
        """The text of every tool result a request carries back to the model."""
        raise NotImplementedError

    # Running ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "the server is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeModel:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length).decode("utf-8", "replace") if length else ""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                reply = model.answer(
                    Request(self.command, self.path, dict(self.headers.items()), raw, body)
                )
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass  # requests are kept, not logged

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def answer(self, request: Request) -> Reply:
        with self._lock:
            transcript = self.transcript
            transcript.requests.append(request)
            if request.method != "POST" or request.body is None or not self.offers_tools(request):
                return self.aside(request)
            request.agent = True
            if transcript.played < len(transcript.script):
                request.turn = transcript.script[transcript.played]
                transcript.played += 1
            else:
                request.turn = Answer(DONE)
            return self.play(request, request.turn)


# Anthropic Messages (Claude Code) -------------------------------------------------------


class AnthropicMessages(FakeModel):
    """The Messages API: ``POST /v1/messages``, streamed or not."""

    def offers_tools(self, request: Request) -> bool:
        return urlsplit(request.path).path.endswith("/messages") and bool(request.body.get("tools"))

    def tool_names(self, request: Request) -> list[str]:
        return [tool.get("name", "") for tool in request.body.get("tools") or []]

    def tool_results(self, request: Request) -> list[str]:
        results = []
        for message in request.body.get("messages") or []:
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_result":
                    results.append(texts(block.get("content")))
        return results

    def aside(self, request: Request) -> Reply:
        path = urlsplit(request.path).path
        if request.method == "POST" and path.endswith("/messages/count_tokens"):
            return json_reply({"input_tokens": 1000})
        if request.method == "POST" and path.endswith("/messages") and request.body is not None:
            return self.play(request, Answer(DONE))
        return json_reply({"type": "error", "error": {"type": "not_found_error"}}, 404)

    def play(self, request: Request, turn: Turn) -> Reply:
        model = request.body.get("model", "claude")
        number = len(self.transcript.requests)
        if isinstance(turn, ToolCall):
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_{number:04d}",
                "name": turn.name,
                "input": turn.arguments,
            }
            stop = "tool_use"
        else:
            block = {"type": "text", "text": turn.text}
            stop = "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 5}
        message = {
            "id": f"msg_{number:04d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not request.body.get("stream"):
            return json_reply(message)
        start = {**block, "input": {}} if block["type"] == "tool_use" else {**block, "text": ""}
        delta = (
            {"type": "input_json_delta", "partial_json": json.dumps(turn.arguments)}
            if isinstance(turn, ToolCall)
            else {"type": "text_delta", "text": block["text"]}
        )
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": {**message, "content": []}}),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": start},
            ),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 5},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        return Reply(200, "text/event-stream", sse(events))


# OpenAI Responses (Codex) ---------------------------------------------------------------


class OpenAIResponses(FakeModel):
    """The Responses API, streamed: ``POST <base_url>/responses``."""

    def offers_tools(self, request: Request) -> bool:
        return urlsplit(request.path).path.endswith("/responses") and bool(
            request.body.get("tools")
        )

    def tool_names(self, request: Request) -> list[str]:
        names = []
        for tool in request.body.get("tools") or []:
            if tool.get("type") == "namespace":  # tools grouped under a server's name
                names += [f"{tool.get('name')}/{t.get('name')}" for t in tool.get("tools", [])]
            else:
                names.append(tool.get("name", ""))
        return names

    def tool_results(self, request: Request) -> list[str]:
        return [
            texts(item.get("output"))
            for item in request.body.get("input") or []
            if item.get("type") == "function_call_output"
        ]

    def aside(self, request: Request) -> Reply:
        path = urlsplit(request.path).path
        if request.method == "GET" and path.endswith("/models"):
            return json_reply({"object": "list", "data": []})
        if request.method == "POST" and path.endswith("/responses") and request.body is not None:
            return self.play(request, Answer(DONE))
        return json_reply({"error": {"message": f"no such route: {request.path}"}}, 404)

    def play(self, request: Request, turn: Turn) -> Reply:
        number = len(self.transcript.requests)
        response_id = f"resp_{number:04d}"
        if isinstance(turn, ToolCall):
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_{number:04d}",
                "call_id": f"call_{number:04d}",
                "name": turn.name,
                "arguments": json.dumps(turn.arguments),
            }
            if turn.namespace:
                item["namespace"] = turn.namespace
        else:
            item = {
                "type": "message",
                "id": f"msg_{number:04d}",
                "role": "assistant",
                "content": [{"type": "output_text", "text": turn.text}],
            }
        usage = {
            "input_tokens": 10,
            "input_tokens_details": None,
            "output_tokens": 5,
            "output_tokens_details": None,
            "total_tokens": 15,
        }
        events: list[tuple[str | None, Any]] = [
            ("response.created", {"type": "response.created", "response": {"id": response_id}}),
            ("response.output_item.added", {"type": "response.output_item.added", "item": item}),
        ]
        if isinstance(turn, Answer):
            events.append(
                (
                    "response.output_text.delta",
                    {"type": "response.output_text.delta", "delta": turn.text},
                )
            )
        events += [
            ("response.output_item.done", {"type": "response.output_item.done", "item": item}),
            (
                "response.completed",
                {"type": "response.completed", "response": {"id": response_id, "usage": usage}},
            ),
        ]
        return Reply(200, "text/event-stream", sse(events))


# Gemini API (Gemini CLI) ----------------------------------------------------------------


class GeminiApi(FakeModel):
    """The Gemini API: ``models/<model>:streamGenerateContent?alt=sse`` and ``:generateContent``."""

    def offers_tools(self, request: Request) -> bool:
        return ":streamGenerateContent" in request.path and bool(self.tool_names(request))

    def tool_names(self, request: Request) -> list[str]:
        return [
            declaration.get("name", "")
            for tool in request.body.get("tools") or []
            for declaration in tool.get("functionDeclarations") or []
        ]

    def tool_results(self, request: Request) -> list[str]:
        results = []
        for content in request.body.get("contents") or []:
            for part in content.get("parts") or []:
                if "functionResponse" in part:
                    response = part["functionResponse"].get("response") or {}
                    output = response.get("output") if isinstance(response, dict) else None
                    results.append(output if isinstance(output, str) else json.dumps(response))
        return results

    def aside(self, request: Request) -> Reply:
        path = urlsplit(request.path).path
        if path.endswith(":countTokens"):
            return json_reply({"totalTokens": 1000})
        if path.endswith((":generateContent", ":streamGenerateContent")):
            return self.play(request, Answer(DONE))
        return json_reply({"error": {"code": 404, "message": f"no such route: {path}"}}, 404)

    def play(self, request: Request, turn: Turn) -> Reply:
        if isinstance(turn, ToolCall):
            part: dict[str, Any] = {"functionCall": {"name": turn.name, "args": turn.arguments}}
        else:
            part = {"text": turn.text}
        response = {
            "candidates": [
                {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": 10,
                "candidatesTokenCount": 5,
                "totalTokenCount": 15,
            },
            "modelVersion": "gemini-fake",
        }
        if ":streamGenerateContent" in request.path:
            return Reply(200, "text/event-stream", sse([(None, response)]))
        return json_reply(response)
