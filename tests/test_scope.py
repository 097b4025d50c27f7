"""Project scope: the real path of the git top-level, else of the directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memory_mcp.errors import InvalidInput
from memory_mcp.scope import project_root, project_scope


def test_a_subdirectory_of_a_repository_has_the_repository_root(project: Path) -> None:
    assert project_root(project / "src" / "pkg") == project.resolve()
    assert project_scope(project / "src").key == str(project.resolve())


def test_a_directory_outside_any_repository_is_its_own_project(tmp_path: Path) -> None:
    plain = tmp_path / "plain" / "dir"
    plain.mkdir(parents=True)
    assert project_root(plain) == plain.resolve()


def test_symlinks_resolve_to_one_project_key(project: Path, tmp_path: Path) -> None:
    link = tmp_path / "link-to-repo"
    link.symlink_to(project, target_is_directory=True)
    assert project_root(link / "src") == project_root(project / "src") == project.resolve()


def test_a_worktree_with_a_git_file_is_a_project_root(tmp_path: Path) -> None:
    worktree = tmp_path / "wt"
    (worktree / "sub").mkdir(parents=True)
    (worktree / ".git").write_text("gitdir: /elsewhere/.git/worktrees/wt\n", encoding="utf-8")
    assert project_root(worktree / "sub") == worktree.resolve()


def test_no_cwd_means_the_process_working_directory(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project / "src")
    assert project_root(None) == project.resolve()


@pytest.mark.parametrize("cwd", ["relative/path", "/definitely/not/here", "/tmp/\x00bad"])
def test_a_bad_cwd_is_refused_with_a_clear_message(cwd: str) -> None:
    with pytest.raises(InvalidInput, match="cwd"):
        project_root(cwd)


def test_a_file_is_not_a_cwd(tmp_path: Path) -> None:
    f = tmp_path / "file.txt"
    f.write_text("x", encoding="utf-8")
    with pytest.raises(InvalidInput, match="not an existing directory"):
        project_root(f)
    assert os.path.isfile(f)
