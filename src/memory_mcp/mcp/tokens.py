"""Who an HTTP request comes from: bearer tokens, and the file that maps them to users.

A shared server (``serve --transport streamable-http``) serving a team reads
``serve.tokens_file``: one user per line, with the SHA-256 of their token, never
the token itself, so a copy of the file lets nobody in::

    # memory-mcp serve tokens: `memory-mcp team token NAME` adds one
    [users]
    alice = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

``memory-mcp team token NAME`` makes a random token, prints it once and writes
its hash (the file is the owner's only, 0600). A request's token is hashed and
compared with every entry in constant time (``hmac.compare_digest``, no early
exit), so neither the answer's time nor its content says which user is near.
The file is read again when it changes: adding a user needs no restart, and
deleting the file admits nobody (an edit that breaks it keeps the users read
last, with a warning in the log).

``serve.token`` stays the single shared token; a request that carries it is
the server's own user.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import logging
import os
import re
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path

from memory_mcp.errors import ConfigError, InvalidInput
from memory_mcp.files import atomic_write

log = logging.getLogger(__name__)

# Where ``transports.BearerAuth`` puts the request's ``Caller`` in its ASGI scope.
CALLER_KEY = "memory_mcp.caller"
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,62}")
_PREFIX = "sha256:"
_HEADER = "# memory-mcp serve tokens: `memory-mcp team token NAME` adds one\n[users]\n"


@dataclass(frozen=True)
class Caller:
    """Whom a request's token names: a user of the tokens file, or the server's own user
    (``user`` None) for ``serve.token``."""

    user: str | None


def digest(token: str) -> str:
    return _PREFIX + hashlib.sha256(token.encode()).hexdigest()


def read_tokens(path: Path) -> dict[str, str]:
    """The users of a tokens file and their token hashes.

    Raises:
        ConfigError: the file cannot be read, or an entry is malformed (named).
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"serve.tokens_file {path}: {exc}") from None
    users = data.get("users", {})
    if not isinstance(users, dict) or set(data) - {"users"}:
        raise ConfigError(f"serve.tokens_file {path}: expected only a [users] table")
    for name, value in users.items():
        if not USER_NAME.fullmatch(name):
            raise ConfigError(f"serve.tokens_file {path}: {name!r} is not a user name")
        if not (isinstance(value, str) and re.fullmatch(_PREFIX + "[0-9a-f]{64}", value)):
            raise ConfigError(
                f"serve.tokens_file {path}: {name}'s entry is not sha256:<64 hex digits>; "
                "add users with `memory-mcp team token NAME`"
            )
    return dict(users)


def add_token(path: Path, user: str) -> str:
    """Give ``user`` a new random token in the tokens file (replacing theirs); the token.

    The file is written whole (``files.atomic_write``), readable by its owner only,
    under a lock, so that two runs at once both land.

    Raises:
        InvalidInput: ``user`` is not a valid name.
        ConfigError: the file exists but is not a tokens file.
    """
    if not USER_NAME.fullmatch(user):
        raise InvalidInput(
            f"{user!r} is not a user name: a letter or _, then up to 62 letters, digits, _ . -"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(path.with_name(f".{path.name}.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        users = read_tokens(path) if path.exists() else {}
        token = secrets.token_urlsafe(32)
        users[user] = digest(token)
        text = _HEADER + "".join(f'{name} = "{value}"\n' for name, value in sorted(users.items()))
        atomic_write(path, text.encode("utf-8"), mode=0o600)
    finally:
        os.close(lock)  # releases the lock
    return token


class Tokens:
    """The tokens a server accepts: ``serve.token`` and the users of ``serve.tokens_file``."""

    def __init__(self, shared: str = "", file: Path | None = None) -> None:
        self._shared = digest(shared) if shared else ""
        self._file = file
        self._seen: tuple[int, int, int] | None = None
        self._users: dict[str, str] = {}
        if file is not None:
            self._reload()

    @property
    def required(self) -> bool:
        return bool(self._shared) or self._file is not None

    def _reload(self) -> None:
        """Read the file again if it changed (a new file, by ``add_token``'s rename, has a
        new inode even when its size and time look the same)."""
        assert self._file is not None
        try:
            stat = self._file.stat()
        except FileNotFoundError:
            if self._users:
                log.warning("serve.tokens_file %s is gone: no user is admitted", self._file)
            self._users, self._seen = {}, None
            return
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if stamp != self._seen:
            self._seen = stamp
            self._users = read_tokens(self._file)

    def caller(self, token: str) -> Caller | None:
        """Whom ``token`` names, or None (refuse the request).

        Every entry is compared, whatever matched, in constant time per entry.
        """
        if self._file is not None:
            try:
                self._reload()
            except (OSError, ConfigError) as exc:
                # Keep the users read last: a broken edit must not lock everyone out.
                log.warning("serve.tokens_file not read again, still using the last one: %s", exc)
        given = digest(token)
        found: Caller | None = None
        if self._shared and hmac.compare_digest(given, self._shared):
            found = Caller(None)
        for user, expected in self._users.items():
            if hmac.compare_digest(given, expected):
                found = Caller(user)
        return found
