"""Project identity: project.id, then the origin remote, then the common git dir, then the path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.git import bare_with_clones, git, repository
from memory_mcp.errors import ConfigError
from memory_mcp.identity import normalize_remote, origin_url
from memory_mcp.scope import project_identity, project_root, project_scope

GITHUB = "github.com/org/app"


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("git@github.com:org/app.git", GITHUB),
        ("git@github.com:org/app", GITHUB),
        ("https://github.com/org/app", GITHUB),
        ("https://github.com/org/app.git", GITHUB),
        ("https://github.com/org/app/", GITHUB),
        ("https://github.com/org/app.git/", GITHUB),
        ("HTTPS://GitHub.COM/org/app", GITHUB),
        ("https://user:ghp_secret@github.com/org/app.git", GITHUB),
        ("https://github.com:443/org/app", GITHUB),
        ("ssh://git@github.com/org/app.git", GITHUB),
        ("ssh://git@github.com:22/org/app.git", GITHUB),
        ("ssh://github.com//org/app", GITHUB),
        ("git+ssh://git@github.com/org/app.git", GITHUB),
        ("git://github.com/org/app.git", GITHUB),
        ("github.com:org/app.git", GITHUB),
        ("https://github.com/org/app?tab=readme#top", GITHUB),
        ("  git@GITHUB.com:org/app.git  ", GITHUB),
        # the path keeps its case: some hosts tell App from app
        ("git@github.com:Org/App.git", "github.com/Org/App"),
        ("https://gitlab.example.com:8443/group/sub/app.git", "gitlab.example.com/group/sub/app"),
        ("ssh://git@[::1]:2222/org/app.git", "[::1]/org/app"),
        ("git@github.com:", None),
        ("https://github.com/", None),
        ("", None),
    ],
)
def test_remote_urls_normalize_to_one_key(url: str, key: str | None) -> None:
    assert normalize_remote(url, base=Path("/")) == key


def test_local_remotes_are_their_real_path(tmp_path: Path) -> None:
    bare = tmp_path / "app.git"
    bare.mkdir()
    (tmp_path / "link.git").symlink_to(bare)
    expected = str(bare.resolve())
    assert normalize_remote(str(bare), base=Path("/")) == expected
    assert normalize_remote(f"{bare}/", base=Path("/")) == expected
    assert normalize_remote(f"file://{bare}", base=Path("/")) == expected
    assert normalize_remote(str(tmp_path / "link.git"), base=Path("/")) == expected
    assert normalize_remote("../app.git", base=tmp_path / "clone") == expected


def test_the_origin_url_is_read_as_git_reads_it(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo", origin="git@github.com:org/app.git")
    git(repo, "remote", "add", "upstream", "https://example.com/other.git")
    config = repo / ".git" / "config"
    assert origin_url(config) == git(repo, "remote", "get-url", "origin")
    with config.open("a", encoding="utf-8") as fh:
        fh.write('[remote "origin2"]\n\turl = nope\n')
    config.write_text(
        "[core]\n\tbare = false\n"
        '[remote "upstream"]\n\turl = https://example.com/other.git\n'
        '[Remote "origin"] ; a comment\n'
        '\tURL = "ssh://git@host/with space.git" # trailing\n'
        "\turl = https://second.example/ignored\n",
        encoding="utf-8",
    )
    assert origin_url(config) == git(repo, "remote", "get-url", "origin")
    assert origin_url(config) == "ssh://git@host/with space.git"
    config.write_text("[remote.origin]\n\turl = git@old.example:a/b\n", encoding="utf-8")
    assert origin_url(config) == "git@old.example:a/b"
    config.write_text("[core]\n\tbare = false\n", encoding="utf-8")
    assert origin_url(config) is None


def test_a_directory_outside_git_is_keyed_by_its_real_path(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    (plain / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(plain)
    identity = project_identity(tmp_path / "link")
    assert (identity.key, identity.how, identity.earlier) == (str(plain.resolve()), "path", ())
    assert project_identity(plain / "sub").key == str((plain / "sub").resolve())


def test_a_repository_without_a_remote_is_keyed_by_its_common_git_dir(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo")
    (repo / "src").mkdir()
    identity = project_identity(repo / "src")
    common = (repo / git(repo, "rev-parse", "--git-common-dir")).resolve()
    assert (identity.key, identity.how) == (str(common), "git")
    assert identity.root == repo.resolve() == project_root(repo / "src")
    assert identity.earlier == (str(repo.resolve()),)  # the key before identities


def test_every_worktree_of_a_clone_shares_one_key(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo", origin="git@github.com:org/app.git")
    git(repo, "worktree", "add", "-q", "-b", "feature", str(tmp_path / "feature"))
    main, feature = project_identity(repo), project_identity(tmp_path / "feature")
    assert main.key == feature.key == GITHUB
    assert main.how == feature.how == "remote"
    assert feature.root == (tmp_path / "feature").resolve()  # spawn files stay in the tree
    paths = {str(repo.resolve()), str((tmp_path / "feature").resolve())}
    assert paths <= set(feature.earlier) and paths <= set(main.earlier)


def test_worktrees_without_a_remote_share_the_common_git_dir(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo")
    git(repo, "worktree", "add", "-q", "-b", "feature", str(tmp_path / "feature"))
    feature = tmp_path / "feature"
    common = (feature / git(feature, "rev-parse", "--git-common-dir")).resolve()
    assert project_identity(feature).key == project_identity(repo).key == str(common)


def test_two_clones_of_one_remote_share_one_key(tmp_path: Path) -> None:
    bare, (alice, bob) = bare_with_clones(tmp_path, "alice", "bob")
    a, b = project_identity(alice), project_identity(bob)
    assert a.key == b.key == str(bare.resolve())
    assert a.how == "remote" and a.source == str(bare)
    git(alice, "remote", "set-url", "origin", "git@github.com:org/app.git")
    git(bob, "remote", "set-url", "origin", "https://github.com/org/app")
    assert project_identity(alice).key == project_identity(bob).key == GITHUB


def test_project_id_in_the_project_file_comes_first(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo", origin="git@github.com:org/app.git")
    (repo / ".memory-mcp.toml").write_text(
        '[project]\nid = " acme/app "\n[brief]\nbudget_tokens = 900\n', encoding="utf-8"
    )
    identity = project_identity(repo)
    assert (identity.key, identity.how) == ("acme/app", "project")
    assert identity.source == str(repo.resolve() / ".memory-mcp.toml")
    assert identity.earlier[:2] == (GITHUB, str((repo / ".git").resolve()))
    assert project_scope(repo).key == "acme/app"


def test_an_edited_project_file_takes_effect_at_once(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo", origin="git@github.com:org/app.git")
    assert project_identity(repo).key == GITHUB
    project_file = repo / ".memory-mcp.toml"
    project_file.write_text('[project]\nid = "one"\n', encoding="utf-8")
    assert project_identity(repo).key == "one"
    project_file.write_text('[project]\nid = "two"\n', encoding="utf-8")
    os.utime(project_file, ns=(1, 1))  # a new mtime, however quick the rewrite
    assert project_identity(repo).key == "two"
    project_file.unlink()
    assert project_identity(repo).key == GITHUB


@pytest.mark.parametrize(
    "text", ["[project]\nid = 3\n", '[project]\nid = "a\\nb"\n', "[project\n", 'project = "x"\n']
)
def test_an_unusable_project_id_is_a_config_error(tmp_path: Path, text: str) -> None:
    (tmp_path / ".memory-mcp.toml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\.memory-mcp\.toml"):
        project_identity(tmp_path)


def test_a_submodule_is_its_own_project(tmp_path: Path) -> None:
    lib = repository(tmp_path / "lib", origin="git@github.com:org/lib.git")
    app = repository(tmp_path / "app", origin="git@github.com:org/app.git")
    git(app, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
    git(app / "lib", "remote", "set-url", "origin", "git@github.com:org/lib.git")
    assert project_identity(app / "lib").key == "github.com/org/lib"
    assert project_identity(app).key == GITHUB


def test_an_empty_git_directory_is_not_a_repository(tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "src").mkdir()
    identity = project_identity(tmp_path / "repo" / "src")
    assert (identity.key, identity.how) == (str((tmp_path / "repo").resolve()), "path")
