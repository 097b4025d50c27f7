"""``memory-mcp serve``: the MCP server over stdio, SSE or streamable HTTP.

One process opens the store and starts loading the embedding model in the
background, then answers at once: ``initialize`` and ``tools/list`` never wait
for the model (searches meanwhile run on the lexical floor and say so).

stdio is what the agent CLIs spawn; it always runs behind ``mcp/front.py``, which
answers the handshake at once and turns SIGINT / SIGTERM into the end of
stdin, so the session ends as if the client had closed it: the current write
transaction finishes, the store closes, the process exits 0. Logs go to
stderr; stdout is the protocol. (Cancelling the SDK's stdio instead would wait
forever on its blocked stdin read.)

The HTTP transports bind 127.0.0.1 by default. Binding any other address needs
a bearer token (``serve.token`` / ``MEMORY_MCP_SERVE_TOKEN``) or a tokens file
(``serve.tokens_file``: one token per user, ``mcp/tokens.py``); with either set,
every request without ``Authorization: Bearer <token>`` gets 401, and the
request carries who sent it (``CALLER_KEY`` in its ASGI scope). The SDK's
DNS-rebinding protection (Host and Origin checks) is on for every address.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio

from memory_mcp.config import LoadedSettings, ServeSettings, load_settings
from memory_mcp.errors import ConfigError, MemoryMcpError
from memory_mcp.mcp.tokens import CALLER_KEY, Tokens, read_tokens
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from mcp.server.transport_security import TransportSecuritySettings

log = logging.getLogger(__name__)

Transport = Literal["stdio", "sse", "streamable-http"]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
PATHS = {"sse": "/sse", "streamable-http": "/mcp"}


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.casefold() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: ServeSettings) -> None:
    """Refuse to serve HTTP on a non-loopback address without a token.

    Raises:
        ConfigError: the host is reachable from other machines and no token is set.
    """
    if settings.tokens_file:
        tokens_path(settings)  # a file that cannot be used stops the start, on any address
    if is_loopback(settings.host):
        return
    if not settings.token and not settings.tokens_file:
        raise ConfigError(
            f"refusing to serve on {settings.host}, which other machines can reach, without a "
            "token: set MEMORY_MCP_SERVE_TOKEN (or pass --token) or serve.tokens_file, or bind "
            "127.0.0.1"
        )
    if settings.token and len(settings.token) < 16:
        raise ConfigError("the serve token is shorter than 16 characters; use a long random one")


def transport_security(settings: ServeSettings) -> TransportSecuritySettings:
    """DNS-rebinding protection for the bound address (on for every address)."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = {"127.0.0.1", "localhost", "[::1]"}
    if not is_loopback(settings.host) and settings.host not in ("0.0.0.0", "::"):
        names.add(settings.host if ":" not in settings.host else f"[{settings.host}]")
    if not is_loopback(settings.host):
        names.add(socket.gethostname())
        names.add(socket.getfqdn())
        if settings.host in ("0.0.0.0", "::"):
            names.update(_local_addresses())
    hosts = sorted(f"{name}:*" for name in names)
    hosts += [h.strip() for h in settings.allowed_hosts.split(",") if h.strip()]
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def _local_addresses() -> set[str]:
    found: set[str] = set()
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return found
    for info in infos:
        address = str(info[4][0])
        found.add(f"[{address}]" if ":" in address else address)
    return found


def tokens_path(settings: ServeSettings) -> Path:
    """The tokens file, checked.

    Raises:
        ConfigError: it is missing, unreadable, malformed, or names no user.
    """
    path = Path(settings.tokens_file).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"serve.tokens_file {path} does not exist; add a user with "
            f"`memory-mcp team token NAME --file {path}`"
        )
    if not read_tokens(path):
        raise ConfigError(f"serve.tokens_file {path} names no user")
    return path


class BearerAuth:
    """ASGI middleware: HTTP requests must carry ``Authorization: Bearer <token>``; the
    request's ASGI scope then holds the ``Caller`` (``CALLER_KEY``)."""

    def __init__(self, app: ASGIApp, tokens: Tokens) -> None:
        self.app = app
        self._tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # websockets and anything newer: not served
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                given = value
        scheme, _, token = given.partition(b" ")
        caller = (
            self._tokens.caller(token.strip().decode("latin-1"))
            if scheme.lower() == b"bearer"
            else None
        )
        if caller is None:
            body = json.dumps({"error": "a valid bearer token is required"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"www-authenticate", b'Bearer realm="memory-mcp"'),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        scope[CALLER_KEY] = caller
        await self.app(scope, receive, send)


async def serve(
    loaded: LoadedSettings,
    transport: Transport = "stdio",
    *,
    ready: Callable[[str], None] | None = None,
    sdk_loaded: Callable[[], None] | None = None,
) -> None:
    """Run the server until its transport ends or a signal asks it to stop.

    The store opens and the start directory's vectors start loading first; the MCP
    SDK (0.6 s to import on a small machine) is imported meanwhile, in a thread: at
    200,000 memories a session's first search came 0.2-0.3 s sooner than with the
    load after the import.

    Args:
        loaded: the settings (``serve`` says where the HTTP transports bind).
        transport: stdio, sse or streamable-http.
        ready: called with a line saying where it serves, once it does.
        sdk_loaded: called once the SDK is imported, before the server starts.

    Raises:
        ConfigError: an unsafe or impossible serve configuration.
    """
    settings = loaded.settings.serve
    listener = None
    if transport != "stdio":
        check_exposure(settings)
        listener = bind(settings.host, settings.port)  # a port in use fails here, plainly
    try:
        async with MemoryService.open(loaded) as memory, anyio.create_task_group() as group:
            group.start_soon(memory.warm_up)  # the start directory's project
            if memory.settings.maintenance.enabled:
                group.start_soon(memory.maintenance_loop)
            server = await anyio.to_thread.run_sync(_build_server, memory)
            if sdk_loaded is not None:
                sdk_loaded()
            if transport == "stdio":
                log.info("serving MCP over stdio (%s)", memory.location)
                await server.run_stdio_async()
            else:
                assert listener is not None
                await _serve_http(server, transport, settings, memory, ready, listener)
            group.cancel_scope.cancel()
    except BaseExceptionGroup as failed:  # one engine error: say it, not the task group
        ours = [e for e in failed.exceptions if isinstance(e, MemoryMcpError)]
        if ours:
            raise ours[0] from None
        raise
    finally:
        if listener is not None:
            listener.close()


def _build_server(memory: MemoryService) -> MCPServer[Any]:
    """The MCP server of ``memory``, the SDK imported first (in a worker thread: the
    warm-up goes on meanwhile)."""
    from memory_mcp.mcp.tools import build_server

    return build_server(memory)


def bind(host: str, port: int, setting: str | None = "serve.port") -> socket.socket:
    """A listening socket on ``host``:``port``, bound before anything else starts
    (``setting``: the setting that also chooses the port, named in the error).

    Raises:
        ConfigError: the port is in use, or the address is not this machine's.
    """
    name = host.strip("[]")
    # As uvicorn binds: IPv6 for an IPv6 address, else IPv4 ("localhost" is 127.0.0.1).
    listener = socket.socket(socket.AF_INET6 if ":" in name else socket.AF_INET)
    try:
        if sys.platform != "win32":
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((name, port))
        listener.listen(128)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            also = f" or {setting}" if setting else ""
            raise ConfigError(
                f"port {port} on {host} is in use (another memory-mcp server?); "
                f"pick another with --port{also}"
            ) from None
        raise ConfigError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    listener.set_inheritable(True)
    return listener


def serve_behind_front(
    cwd: str | None,
    handshake_versions: Callable[[list[str]], None],
    loaded: LoadedSettings | None,
) -> int:
    """The real stdio server, in the front's thread (``mcp/front.py``); returns the exit code.

    Args:
        cwd: the working directory whose project to serve (None: the current one).
        handshake_versions: given the protocol versions the SDK negotiates in its
            handshake, before it serves (the front caches them with its answers).
        loaded: the settings, as the front loaded them (None: it could not; they are
            loaded here, and what is wrong with them is said).
    """

    def sdk_loaded() -> None:
        from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

        handshake_versions(list(HANDSHAKE_PROTOCOL_VERSIONS))

    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        if loaded is None:
            loaded = load_settings(project_root=project_root(cwd))
        anyio.run(partial(serve, loaded, "stdio", sdk_loaded=sdk_loaded))
    except MemoryMcpError as exc:
        print(f"memory-mcp: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception:
        log.exception("the server failed")
        return 1
    return 0


async def _serve_http(
    server: Any,
    transport: Transport,
    settings: ServeSettings,
    memory: MemoryService,
    ready: Callable[[str], None] | None,
    listener: socket.socket,
) -> None:
    from memory_mcp.viewer.app import build_app

    security = transport_security(settings)
    if transport == "sse":
        app = server.sse_app(transport_security=security, host=settings.host)
    else:
        app = server.streamable_http_app(transport_security=security, host=settings.host)
    tokens = Tokens(settings.token, tokens_path(settings) if settings.tokens_file else None)
    mcp: ASGIApp = BearerAuth(app, tokens) if tokens.required else app
    # The viewer's pages under /ui: signed in by a cookie (a browser sends no bearer token).
    viewer = build_app(
        memory,
        tokens=tokens,
        security=security,
        prefix=VIEWER_PATH,
        runs_tasks=memory.settings.maintenance.enabled,
    )
    asgi = _Paths(mcp, viewer)
    url = f"{base_url(settings)}{PATHS[transport]}"
    line = f"serving MCP over {transport} at {url} ({memory.location}); viewer at "
    line += f"{base_url(settings)}{VIEWER_PATH}/"
    await serve_asgi(asgi, settings, listener, line if ready is not None else None, ready)


VIEWER_PATH = "/ui"


class _Paths:
    """The viewer's paths to the viewer, everything else (and the lifespan) to MCP."""

    def __init__(self, mcp: ASGIApp, viewer: ASGIApp) -> None:
        self.mcp = mcp
        self.viewer = viewer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == VIEWER_PATH or path.startswith(VIEWER_PATH + "/"):
            await self.viewer(scope, receive, send)
        else:
            await self.mcp(scope, receive, send)


def base_url(settings: ServeSettings, port: int | None = None) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{settings.port if port is None else port}"


async def serve_asgi(
    asgi: ASGIApp,
    settings: ServeSettings,
    listener: socket.socket,
    line: str | None,
    ready: Callable[[str], None] | None,
) -> None:
    """Serve ``asgi`` with uvicorn on ``listener`` until SIGINT / SIGTERM; ``ready`` gets
    ``line`` once it serves.

    Raises:
        ConfigError: uvicorn could not start.
    """
    import uvicorn

    config = uvicorn.Config(
        asgi,
        host=settings.host,
        port=listener.getsockname()[1],
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )

    class Http(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and ready is not None and line is not None:
                ready(line)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """Stop gracefully on SIGINT / SIGTERM and return, so the store closes.

            (uvicorn's own version raises the signal again afterwards, which kills
            the process before the store is closed.)
            """

            def stop(signum: int, _frame: object) -> None:
                if self.should_exit and signum == signal.SIGINT:
                    self.force_exit = True
                self.should_exit = True

            stoppers = (signal.SIGINT, signal.SIGTERM)
            previous = {signum: signal.signal(signum, stop) for signum in stoppers}
            try:
                yield
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)

    http = Http(config)
    with contextlib.suppress(SystemExit):  # uvicorn exits when it cannot start
        await http.serve(sockets=[listener])
    if not http.started:
        raise ConfigError(f"could not serve at {base_url(settings)} (see the log above)")
