"""Real git repositories, as a user makes them (``git init``, ``clone``, ``worktree add``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str) -> str:
    """Run git in ``cwd`` (no user or system config); its output, stripped."""
    done = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env={**os.environ, **_ENV},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout.strip()


def repository(path: Path, *, origin: str | None = None) -> Path:
    """A repository with one commit (and an ``origin`` remote if given)."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("# app\n", encoding="utf-8")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "first")
    if origin is not None:
        git(path, "remote", "add", "origin", origin)
    return path


def bare_with_clones(tmp_path: Path, *names: str) -> tuple[Path, list[Path]]:
    """A bare repository and clones of it: what two people (or two checkouts) have."""
    source = repository(tmp_path / "source")
    bare = tmp_path / "app.git"
    git(tmp_path, "clone", "-q", "--bare", str(source), str(bare))
    clones = []
    for name in names:
        git(tmp_path, "clone", "-q", str(bare), str(tmp_path / name))
        clones.append(tmp_path / name)
    return bare, clones
