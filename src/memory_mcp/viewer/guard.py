"""What stands in front of every viewer page: the same rules as ``serve``, and what a
browser needs besides.

- **DNS rebinding.** The ``Host`` (and any ``Origin``) must name this server, by
  the MCP SDK's own check with ``transports.transport_security``'s lists.
- **Who.** With ``serve.token`` or ``serve.tokens_file`` set, a request carries
  ``Authorization: Bearer <token>`` or the session cookie the sign-in page sets
  for a good token (``HttpOnly``, ``SameSite=Strict``; sessions live in the
  process). The request's ``Caller`` goes where ``BearerAuth`` puts it.
- **Cross-site requests.** A page that can archive memories is a CSRF target.
  Every request that changes something is a POST that must come from this
  origin (``Origin``, else ``Sec-Fetch-Site``, must say so) and carry the form
  token the pages embed: an HMAC of the session (or of the process's secret
  when no sign-in is needed) that another site cannot read.
- **What the browser may do.** A Content-Security-Policy that allows no script
  at all, styles and images from this server only, forms posting here only and
  no framing; ``nosniff``, no referrer to other sites; no page cached (the
  stylesheet is, under a URL that names the version).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request

from memory_mcp.mcp.tokens import CALLER_KEY, Caller, Tokens

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COOKIE = "memory_mcp_viewer"
CSRF_FIELD = "csrf"
SESSION_KEY = "memory_mcp.viewer_session"  # the request's session id, in its ASGI scope
STARTED_KEY = "memory_mcp.viewer_started"  # when the request came (perf_counter)
POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # "no-referrer" makes a form post "Origin: null"
    (b"x-frame-options", b"DENY"),
]
SAFE_METHODS = frozenset({"GET", "HEAD"})
SIGN_IN = "/sign-in"  # the one page (and POST) open without a token
STATIC = "/static/"  # the stylesheet: cached (its URL names the version), the pages never
ICON = "/favicon.ico"  # where browsers look for the icon (served as the static SVG)
_FORM_MOST = 1 << 20  # bytes of a form body read to find its token


SESSION_IDLE_S = 8 * 3600  # a sign-in unused this long ends
SESSIONS_MOST = 1000  # sign-ins kept; the least recently used go first


@dataclass
class Sessions:
    """Signed-in browsers: a random id per sign-in, and the token it was made with.

    The token is checked again on every request, so a user removed from the
    tokens file (or a changed ``serve.token``) is out at once; a session unused
    for ``SESSION_IDLE_S`` ends, and signing out ends it at once.
    """

    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    tokens: dict[str, tuple[str, float]] = field(default_factory=dict)  # id: (token, last use)

    def open(self, token: str) -> str:
        session = secrets.token_urlsafe(32)
        self.tokens[session] = (token, time.monotonic())
        while len(self.tokens) > SESSIONS_MOST:
            del self.tokens[min(self.tokens, key=lambda s: self.tokens[s][1])]
        return session

    def token(self, session: str) -> str | None:
        """The token a live session was made with (and it counts as used now)."""
        found = self.tokens.get(session)
        if found is None or time.monotonic() - found[1] > SESSION_IDLE_S:
            self.tokens.pop(session, None)
            return None
        self.tokens[session] = (found[0], time.monotonic())
        return found[0]

    def close(self, session: str) -> None:
        self.tokens.pop(session, None)

    def form_token(self, session: str) -> str:
        """The token a page's forms carry: an HMAC of the session, never sent elsewhere."""
        return hmac.new(self.secret, session.encode(), "sha256").hexdigest()


class Guard:
    """ASGI middleware for the viewer's routes (see the module's docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Tokens,
        security: TransportSecuritySettings,
        sessions: Sessions,
        prefix: str = "",
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.hosts = TransportSecurityMiddleware(security)
        self.sessions = sessions
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        scope[STARTED_KEY] = time.perf_counter()
        headers = _headers(scope)

        path = scope.get("path", "")
        static = path.startswith(self.prefix + STATIC) or path == self.prefix + ICON

        async def secured(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                kept = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"cache-control"
                ]
                stored = static and message.get("status") == 200  # the stylesheet and icon
                cache = b"public, max-age=86400, immutable" if stored else b"no-store"
                message["headers"] = [*kept, *HEADERS, (b"cache-control", cache)]
            await send(message)

        refused = await self.hosts.validate_request(Request(scope), is_post=False)
        if refused is not None:  # the Host or the Origin names another server
            await refused(scope, receive, secured)
            return
        method = scope["method"]
        safe = method in SAFE_METHODS
        if not safe and not _same_origin(headers, scope):
            await _plain(secured, 403, "cross-site request refused")
            return
        session = _cookie(headers.get("cookie", ""), COOKIE)
        caller = self._caller(headers, session)
        signing_in = path == self.prefix + SIGN_IN
        if caller is None and not signing_in and not (static and safe):
            if safe:  # back to this page once signed in (the projects page: no need)
                query = scope.get("query_string", b"").decode("latin-1")
                wanted = path + (f"?{query}" if query else "")
                after = "" if wanted in (self.prefix, self.prefix + "/") else wanted
                back = f"?next={quote(after, safe='')}" if after else ""
                await _redirect(secured, f"{self.prefix}{SIGN_IN}{back}")
            else:
                await _plain(secured, 401, "sign in first")
            return
        session_id = session if session in self.sessions.tokens else ""
        scope[SESSION_KEY] = session_id
        if caller is not None:
            scope[CALLER_KEY] = caller
        if not safe:
            body = await _read_body(receive)
            if body is None:
                await _plain(secured, 413, "the form is too large")
                return
            given = parse_qs(body.decode("utf-8", "replace")).get(CSRF_FIELD, [""])[0]
            if not signing_in and not hmac.compare_digest(
                given, self.sessions.form_token(session_id)
            ):
                await _plain(secured, 403, "the form's token is missing or stale: reload the page")
                return
            receive = _replay(body)
        await self.app(scope, receive, secured)

    def _caller(self, headers: dict[str, str], session: str) -> Caller | None:
        """Who the request is from; with no token configured, the server's own user."""
        if not self.tokens.required:
            return Caller(None)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return self.tokens.caller(token.strip())
        signed = self.sessions.token(session) if session else None
        return self.tokens.caller(signed) if signed is not None else None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _same_origin(headers: dict[str, str], scope: Scope) -> bool:
    """Whether a browser says the request comes from a page of this very origin.

    ``Origin`` is compared with the ``Host`` the request was sent to (scheme
    included); a browser that sends no ``Origin`` sends ``Sec-Fetch-Site``. A
    client that sends neither is not a browser page (``curl``) and still needs
    the form token.
    """
    origin = headers.get("origin")
    if origin is not None:
        return origin == f"{scope.get('scheme', 'http')}://{headers.get('host', '')}"
    site = headers.get("sec-fetch-site")
    return site is None or site in ("same-origin", "none")


def _cookie(header: str, name: str) -> str:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


async def _read_body(receive: Receive) -> bytes | None:
    """The request's body, or None past ``_FORM_MOST`` bytes (no form here is that big)."""
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if len(body) > _FORM_MOST:
            return None
        if not message.get("more_body"):
            return body


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> MutableMapping[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _plain(send: Send, status: int, text: str) -> None:
    body = f"{text}\n".encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, target: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [(b"location", target.encode()), (b"content-length", b"0")],
        }
    )
    await send({"type": "http.response.body", "body": b""})
