"""A fast front for ``memory-mcp serve`` over stdio: the handshake in milliseconds.

Importing the MCP SDK and its pydantic models takes seconds on a small machine,
while an agent CLI waits for ``initialize`` and ``tools/list`` before it starts.
This module, standard library only, answers those two from a cache of the
server's own earlier answers, while the real server (``transports.serve_behind_front``)
imports and starts in a thread behind two pipes that stand in for stdin and
stdout.

Every client message is still passed to the real server, in order, so its
session state is exactly as if it had answered itself; its answers to the
requests the front already answered are compared with what the front sent and
dropped. A difference (a new version, changed tools) rewrites the cache, so the
next launch is right again; with no cache yet, the front passes everything
through and learns the answers from the wire. The front never answers anything
else, and only the legacy handshake (``initialize``) era: in the per-request
era every message goes straight through.

Shutdown: stdin closing, SIGINT or SIGTERM all close the real server's input,
which ends its session cleanly (the store is closed, no write is half-done);
the process exits when the server's output ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import select
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from memory_mcp import __version__
from memory_mcp.dirs import HANDSHAKE_CACHE, cache_dir

if TYPE_CHECKING:
    from memory_mcp.config import LoadedSettings

# The server thread's last line on the pipe: its output has ended. (The SDK keeps
# a duplicate of the pipe's write end open, so the relay would never see EOF.)
_END = b"\x00memory-mcp: server output ends\n"


def cache_key() -> str:
    """What the cached answers depend on: this package's tools and the SDK's version."""
    digest = hashlib.sha256(__version__.encode())
    digest.update((Path(__file__).parent / "tools.py").read_bytes())
    spec = importlib.util.find_spec("mcp")
    if spec is not None and spec.origin:
        stat = os.stat(spec.origin)
        digest.update(f"{spec.origin}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def _id_key(message: dict[str, Any]) -> str:
    return json.dumps(message.get("id"), sort_keys=True)


class Front:
    """Answers the handshake from the cache and relays everything else."""

    def __init__(self, client_in: int, client_out: int, server_in: int, server_out: int) -> None:
        self._client_in = client_in
        self._client_out = client_out
        self._server_in: int | None = server_in
        self._server_out = server_out
        self._out_lock = threading.Lock()
        self._in_lock = threading.Lock()
        self._key = cache_key()
        self._path = cache_dir() / HANDSHAKE_CACHE
        self._cache = self._load()
        self._learned: dict[str, Any] = {}
        self._expected: dict[str, tuple[str, Any]] = {}  # request id -> (method, answer sent)
        self._pending: dict[str, Any] = {}  # requests passed to the server, not yet answered
        self._client_gone = False
        self._handshake = False
        self.versions: list[str] = []  # the SDK's handshake versions, from the server thread

    def learn_versions(self, versions: list[str]) -> None:
        """Take the protocol versions the server's SDK negotiates (cached with its answers)."""
        self.versions = list(versions)

    def _load(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("key") != self._key:
            return None
        versions = data.get("versions")
        if not (
            isinstance(versions, list) and versions and all(isinstance(v, str) for v in versions)
        ):
            return None
        if not (
            isinstance(data.get("initialize"), dict) and isinstance(data.get("tools_list"), dict)
        ):
            return None
        return data

    # Client -> server --------------------------------------------------------------

    def relay_client(self) -> None:
        """Read the client's messages until stdin ends, answering the handshake if cached."""
        try:
            with open(self._client_in, "rb", buffering=0, closefd=False) as raw:
                for line in _lines(raw):
                    self._from_client(line)
        finally:
            self.close_server_input()  # whatever happened, the server's session ends

    def _from_client(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            message = None  # the server answers a parse error itself
        if message is not None and _SURROGATE_ESCAPE.search(line):
            # JSON may escape a lone UTF-16 surrogate; the server's parser drops such a
            # message without an answer. Replace them (as stored text does) instead.
            with contextlib.suppress(RecursionError):  # too deep to walk: as it came
                message = _without_surrogates(message)
                line = json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n"
        if isinstance(message, dict) and "id" in message and "method" in message:
            self._pending[_id_key(message)] = message["id"]
            method = message.get("method")
            params = message.get("params")
            params = params if isinstance(params, dict) else {}
            if method == "initialize":
                self._handshake = True
                self._answer(message, "initialize", self._initialize_result(params))
            elif method == "tools/list" and self._handshake and not params.get("cursor"):
                tools = self._cache.get("tools_list") if self._cache else None
                self._answer(message, "tools/list", tools)
        self._to_server(line)

    def _initialize_result(self, params: dict[str, Any]) -> dict[str, Any] | None:
        if self._cache is None:
            return None
        versions = self._cache["versions"]
        requested = params.get("protocolVersion")
        negotiated = requested if requested in versions else versions[-1]
        return {**self._cache["initialize"], "protocolVersion": negotiated}

    def _answer(self, message: dict[str, Any], method: str, result: Any) -> None:
        self._expected[_id_key(message)] = (method, result)
        if result is not None:
            self._pending.pop(_id_key(message), None)  # answered here
            self._to_client({"jsonrpc": "2.0", "id": message["id"], "result": result})

    def _to_server(self, line: bytes) -> None:
        with self._in_lock:
            if self._server_in is None:
                return
            view = memoryview(line)
            try:
                while view:
                    view = view[os.write(self._server_in, view) :]
            except OSError:
                self._server_in = None

    def close_server_input(self) -> None:
        """End the server's input: its session ends as on stdin close."""
        with self._in_lock:
            if self._server_in is not None:
                os.close(self._server_in)
                self._server_in = None

    # Server -> client --------------------------------------------------------------

    def relay_server(self, wake: int | None = None) -> None:
        """Copy the server's output to the client until it ends, dropping answered replies.

        Args:
            wake: the signal wakeup fd's read end; waiting on it too lets a signal
                taken by another thread (native ones included) reach this thread.
        """
        with open(self._server_out, "rb", buffering=0, closefd=False) as raw:
            for line in _lines(raw, wake):
                if line == _END:
                    return
                self._from_server(line)

    def _from_server(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if isinstance(message, dict) and "id" in message and "method" not in message:
            self._pending.pop(_id_key(message), None)
        if (
            isinstance(message, dict)
            and "id" in message
            and "method" not in message
            and _id_key(message) in self._expected
        ):
            method, sent = self._expected.pop(_id_key(message))
            result = message.get("result")
            if sent is not None:
                if result != sent:
                    self._learn(method, result)
                return  # the client already has its answer
            self._learn(method, result)
        self._write_client(line)

    def _learn(self, method: str, result: Any) -> None:
        if not isinstance(result, dict):
            return
        if method == "tools/list" and not isinstance(result.get("tools"), list):
            return
        if method == "initialize" and not isinstance(result.get("serverInfo"), dict):
            return
        if method == "initialize":
            self._learned["initialize"] = {
                k: v for k, v in result.items() if k != "protocolVersion"
            }
        else:
            self._learned["tools_list"] = result
        self._save()

    def _save(self) -> None:
        base = self._cache or {}
        data = {
            "key": self._key,
            "versions": self.versions or base.get("versions"),
            "initialize": self._learned.get("initialize", base.get("initialize")),
            "tools_list": self._learned.get("tools_list", base.get("tools_list")),
        }
        if not all(data.values()):
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(data), encoding="utf-8")
            os.replace(temporary, self._path)
        except OSError:
            return  # a cache that cannot be written only costs speed

    def _to_client(self, message: dict[str, Any]) -> None:
        self._write_client(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def _write_client(self, data: bytes) -> None:
        with self._out_lock:
            if self._client_gone:
                return
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(self._client_out, view) :]
            except OSError:  # the client closed its end: end the session cleanly
                self._client_gone = True
        if self._client_gone:
            self.close_server_input()

    def fail_pending(self, reason: str) -> None:
        """Answer every request the server left unanswered (it ended early) with an error."""
        for request_id in list(self._pending.values()):
            self._to_client(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": -32603, "message": f"memory-mcp stopped: {reason}"},
                }
            )
        self._pending.clear()


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_surrogates(value: Any) -> Any:
    """A parsed JSON value with every lone surrogate replaced by U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


def _lines(raw: Any, wake: int | None = None) -> Any:
    """Lines from an unbuffered binary file, as they arrive.

    With ``wake``, wait on it as well: a byte there means a signal came in, and
    returning to Python code lets its handler run here.
    """
    pending = b""
    while True:
        if wake is not None:
            readable: list[Any] = []
            while raw.fileno() not in readable:
                readable, _, _ = select.select([raw.fileno(), wake], [], [])
                if wake in readable:
                    os.read(wake, 512)
        chunk = raw.read(65536)
        if not chunk:
            if pending.strip():
                yield pending + b"\n"
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line + b"\n"


def _preload_model(cwd: str | None) -> LoadedSettings | None:
    """Load the settings and start loading the embedding model, before the server
    imports the MCP SDK; returns the settings for the server.

    Both take about half a second; side by side, a session's first search finds
    the model ready sooner. Any problem is left for the server to report (None).
    """
    try:
        from memory_mcp.config import load_settings
        from memory_mcp.embedders.runtime import preload
        from memory_mcp.scope import project_root

        loaded = load_settings(project_root=project_root(cwd))
        preload(loaded.settings.embedder)
    except Exception:  # the server loads the settings itself and says what is wrong
        return None
    return loaded


def _signal_wakeup() -> int | None:
    """A pipe the interpreter writes to when a signal arrives, in any thread (POSIX)."""
    if sys.platform == "win32":
        return None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    return wake_r


def run(cwd: str | None) -> NoReturn:
    """Serve over stdio behind the front; never returns (the process exits)."""
    client_in, client_out = os.dup(0), os.dup(1)
    to_server_r, to_server_w = os.pipe()
    from_server_r, from_server_w = os.pipe()
    os.dup2(to_server_r, 0)
    os.dup2(from_server_w, 1)
    os.close(to_server_r)
    os.close(from_server_w)
    front = Front(client_in, client_out, to_server_w, from_server_r)
    exit_code = [1]

    def server() -> None:
        code = 1
        try:
            loaded = _preload_model(cwd)
            from memory_mcp.mcp.transports import serve_behind_front

            code = serve_behind_front(cwd, front.learn_versions, loaded)
        except BaseException:
            traceback.print_exc(file=sys.stderr)
        finally:
            exit_code[0] = code
            os.write(1, _END)  # fd 1 is the pipe again once the SDK's stdio has ended
            os.dup2(2, 1)

    stops = [0]

    def stop(signum: int, _frame: object) -> None:
        stops[0] += 1
        if stops[0] > 1:
            os._exit(128 + signum)
        front.close_server_input()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=front.relay_client, name="front-stdin", daemon=True).start()
    worker = threading.Thread(target=server, name="memory-mcp-server", daemon=True)
    worker.start()
    front.relay_server(_signal_wakeup())
    worker.join(timeout=10)
    if exit_code[0] != 0:
        front.fail_pending(f"the server exited with status {exit_code[0]}; see its stderr")
    sys.stderr.flush()
    os._exit(exit_code[0])
