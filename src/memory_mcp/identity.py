"""Project identity: the key a project's memories are stored under.

One function, ``identify``, decides it for a directory, in this order:

1. ``project`` — an explicit ``[project] id`` in the ``.memory-mcp.toml`` at
   the project root (committed, so a team agrees on it);
2. ``remote`` — the ``origin`` remote's URL, normalized (``normalize_remote``):
   ``git@github.com:org/app.git``, ``https://github.com/org/app`` and
   ``ssh://git@github.com:22/org/app.git`` are all ``github.com/org/app``;
3. ``git`` — the real path of the repository's common git directory, which
   every worktree of one clone shares (``/home/me/app/.git``);
4. ``path`` — the real path of the directory itself (not in a repository).

The project *root* (the working tree on disk, where spawn files, ingest and
path confinement act) is unchanged: the nearest directory holding ``.git``,
else the directory. Before identities, the key was that root's path; those
keys, and what the lower rules give, are the project's ``earlier`` keys, which
the engine turns into aliases of the key the first time it sees the project.

Nothing here spawns git: ``.git`` (a directory, or a ``gitdir:`` file in
worktrees and submodules), ``commondir`` and the ``[remote "origin"]`` of the
common ``config`` are read directly (``git remote get-url`` would also apply
``url.*.insteadOf`` rewrites and ``include``d files; the URL as the repository
states it is what a team shares, so neither is read).

Results are cached per directory for the life of the process, and each hit is
checked against the modification times of the files it was read from (the
project file, ``.git`` and the common ``config``): three ``stat`` calls, so an
edited ``project.id``, a changed remote or a ``git init`` at the root takes
effect on the next call (a repository made in a parent directory does not).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from memory_mcp.errors import ConfigError

How = Literal["project", "remote", "git", "path"]
PROJECT_FILE = ".memory-mcp.toml"
MAX_ID_CHARS = 200
_CACHE_SIZE = 512

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_SCP = re.compile(r"^(?:[^@/]+@)?([^:/]+):(.*)$", re.DOTALL)  # [user@]host:path
_SECTION = re.compile(r'^\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]')


@dataclass(frozen=True)
class ProjectIdentity:
    """Which project a directory belongs to, and how that was decided."""

    key: str  # the scope key of its memories
    how: How  # which rule gave it: project (project.id), remote, git, path
    source: str  # what the rule read: the file, the remote URL, the git directory
    root: Path  # the working tree on disk (spawn files, ingest, confinement)
    earlier: tuple[str, ...] = ()  # keys this project may have had (become aliases)


def identify(directory: Path) -> ProjectIdentity:
    """The identity of a directory given as a real (symlink-free) absolute path.

    Raises:
        ConfigError: the project's ``.memory-mcp.toml`` cannot be read, or its
            ``project.id`` is not a short line of text.
    """
    cached = _CACHE.get(str(directory))
    if cached is not None and cached[1] == _signature(cached[2]):
        return cached[0]
    identity, watched = _identify(directory)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.clear()
    _CACHE[str(directory)] = (identity, _signature(watched), watched)
    return identity


_Signature = tuple[int | None, ...]
_CACHE: dict[str, tuple[ProjectIdentity, _Signature, tuple[Path, ...]]] = {}


def _signature(paths: tuple[Path, ...]) -> _Signature:
    stamps: list[int | None] = []
    for path in paths:
        try:
            stamps.append(os.stat(path).st_mtime_ns)
        except OSError:
            stamps.append(None)
    return tuple(stamps)


def find_root(directory: Path) -> tuple[Path, Path | None]:
    """The working tree of a directory and its ``.git`` (None outside a repository)."""
    for candidate in (directory, *directory.parents):
        dotgit = candidate / ".git"
        if dotgit.exists():
            return candidate, dotgit
    return directory, None


def _identify(directory: Path) -> tuple[ProjectIdentity, tuple[Path, ...]]:
    root, dotgit = find_root(directory)
    project_file = root / PROJECT_FILE
    common = _common_dir(dotgit) if dotgit is not None else None
    watched = (project_file, root / ".git", (common or root) / "config")
    explicit = project_id(project_file)
    url = origin_url(common / "config") if common is not None else None
    remote = normalize_remote(url, base=root) if url else None
    found: list[tuple[How, str, str]] = []
    if explicit:
        found.append(("project", explicit, str(project_file)))
    if remote:
        found.append(("remote", remote, _without_credentials(url or "")))
    if common is not None:
        found.append(("git", str(common), str(common)))
    found.append(("path", str(root), str(root)))
    how, key, source = found[0]
    earlier = [k for _, k, _ in found[1:]]
    if common is not None:
        earlier += [str(p) for p in worktrees(common)]
    earlier = [k for k in dict.fromkeys(earlier) if k != key]
    return ProjectIdentity(key, how, source, root, tuple(earlier)), watched


# .memory-mcp.toml ---------------------------------------------------------------------


def project_id(path: Path) -> str | None:
    """The ``[project] id`` of a project file, if it has one."""
    import tomllib  # only where a project file exists: most directories have none

    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    section = data.get("project")
    if section is None:
        return None
    value = section.get("id") if isinstance(section, dict) else None
    if not isinstance(value, str) or (value and not value.strip()):
        raise ConfigError(f"{path}: project.id must be a non-empty string")
    value = value.strip()
    if len(value) > MAX_ID_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(
            f"{path}: project.id must be one line of at most {MAX_ID_CHARS} characters"
        )
    return value or None


# Git, without git ---------------------------------------------------------------------


def _common_dir(dotgit: Path) -> Path | None:
    """The repository's common git directory, as ``git rev-parse --git-common-dir``."""
    gitdir = dotgit
    if dotgit.is_file():
        try:
            text = dotgit.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        if not text.startswith("gitdir:"):
            return None
        gitdir = dotgit.parent / text.removeprefix("gitdir:").strip()
    try:
        common = (gitdir / "commondir").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        common = ""
    target = Path(os.path.realpath(gitdir / common if common else gitdir))
    # What git accepts as a repository: HEAD, objects and refs (an empty .git is not one).
    valid = (gitdir / "HEAD").is_file() and (target / "objects").is_dir()
    return target if valid and (target / "refs").is_dir() else None


def worktrees(common: Path) -> list[Path]:
    """The working trees of a repository: the main one, then each linked one."""
    found: list[Path] = []
    if common.name == ".git":
        found.append(common.parent)
    try:
        linked = sorted((common / "worktrees").iterdir())
    except OSError:
        linked = []
    for entry in linked:
        try:
            dotgit = (entry / "gitdir").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        found.append(Path(os.path.realpath(Path(dotgit).parent)))
    return found


def origin_url(config: Path) -> str | None:
    """The first ``url`` of ``[remote "origin"]`` in a git config file."""
    try:
        text = config.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    in_origin = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            match = _SECTION.match(line)
            if match is None:
                in_origin = False
                continue
            name, sub = match.group(1).lower(), match.group(2)
            if sub is None and "." in name:  # the old [remote.origin] spelling
                name, _, sub = name.partition(".")
            in_origin = name == "remote" and sub is not None and _unescape(sub) == "origin"
            continue
        if in_origin:
            name, sep, value = line.partition("=")
            if sep and name.strip().lower() == "url":
                return _config_value(value) or None
    return None


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _config_value(raw: str) -> str:
    """A git config value: quotes joined, escapes read, a trailing comment dropped."""
    out: list[str] = []
    quoted = False
    chars = iter(raw.strip())
    for char in chars:
        if char == '"':
            quoted = not quoted
        elif char == "\\":
            escaped = next(chars, "")
            out.append({"n": "\n", "t": "\t", "b": "\b"}.get(escaped, escaped))
        elif char in "#;" and not quoted:
            break
        else:
            out.append(char)
    return "".join(out).strip()


# Remote URLs --------------------------------------------------------------------------


def normalize_remote(url: str, *, base: Path) -> str | None:
    """A remote URL as ``host/path``: one key for every way of writing one repository.

    The scheme, user, password and port go; the host is lower-cased; a trailing
    ``/`` and ``.git`` go; the path keeps its case (some hosts tell ``App`` from
    ``app``). A local repository (a path or ``file://`` URL) is its real path,
    relative ones taken from ``base``. None when nothing usable is left.
    """
    url = url.strip()
    scheme = _SCHEME.match(url)
    if scheme is not None and scheme.group(1).lower() == "file":
        return _local(scheme.group(2).removeprefix("localhost"), base)
    if scheme is not None:
        authority, _, path = scheme.group(2).partition("/")
        host = authority.rpartition("@")[2]
        host = host[: host.index("]") + 1] if host.startswith("[") else host.partition(":")[0]
        path = re.split(r"[?#]", path, maxsplit=1)[0]
    else:
        scp = _SCP.match(url)
        if scp is None or "/" in url.partition(":")[0]:
            return _local(url, base) if url else None
        host, path = scp.group(1), scp.group(2)
    host = host.strip().lower().rstrip(".")
    path = re.sub(r"/{2,}", "/", path.strip()).strip("/")
    path = path.removesuffix(".git").rstrip("/")
    if not host or not path:
        return None
    return f"{host}/{path}"


def _local(path: str, base: Path) -> str | None:
    if not path:
        return None
    return os.path.realpath(base / os.path.expanduser(path)).rstrip("/") or "/"


def _without_credentials(url: str) -> str:
    """A URL fit to show: no password or token in ``scheme://user:secret@host``."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1", url.strip())
