"""``project show|attach|detach|adopt``, the identity in ``status``, and ``team init`` /
``team add-user``, through CliRunner."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anyio
import pytest

from helpers import postgres
from helpers.cli import run
from helpers.git import git, repository


@pytest.fixture(autouse=True)
def _lexical(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")


def test_status_and_project_show_say_the_key_and_how_it_was_found(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo", origin="git@github.com:Org/App.git")
    code, out, err = run("status", "--json", cwd=repo)
    assert code == 0, err
    data = json.loads(out)
    assert data["project"] == str(repo.resolve())  # the working tree on disk, as before
    assert data["identity"] == {
        "key": "github.com/Org/App",
        "how": "remote",
        "source": "git@github.com:Org/App.git",
        "root": str(repo.resolve()),
        "aliases": [],
    }
    code, out, _ = run("status", cwd=repo)
    assert "project key     github.com/Org/App  (origin remote)" in out
    code, out, _ = run("project", "show", cwd=repo)
    assert code == 0
    assert "project key     github.com/Org/App" in out
    assert "found from      origin remote git@github.com:Org/App.git" in out


def test_an_alias_is_detached_and_attached_again_from_the_command_line(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    (clone / ".memory-mcp.toml").write_text('[project]\nid = "acme/app"\n', encoding="utf-8")
    (repo / ".memory-mcp.toml").write_text('[project]\nid = "acme/app"\n', encoding="utf-8")
    plain = tmp_path / "plain"  # an unrelated directory's memories, attached by hand
    plain.mkdir()
    assert run("store", "Migrations run before the deploy", cwd=plain)[0] == 0
    code, out, err = run("project", "attach", str(plain), "--json", cwd=clone)
    assert code == 0, err
    assert [a["alias"] for a in json.loads(out)["aliases"]] == [str(plain.resolve())]
    code, out, _ = run("search", "migrations deploy", cwd=repo)
    assert "Migrations run before the deploy" in out
    code, out, _ = run("project", "detach", str(plain), cwd=repo)
    assert code == 0 and "detached        " + str(plain.resolve()) in out
    code, out, _ = run("search", "migrations deploy", cwd=repo)
    assert "Migrations run before the deploy" not in out
    code, _, err = run("project", "detach", str(plain), cwd=repo)
    assert code == 66 and "not an alias" in err
    code, out, _ = run("project", "adopt", "--json", cwd=repo)
    assert code == 0 and json.loads(out)["adopted"] == []


def test_team_init_and_add_user_prepare_a_postgres_store_and_refuse_a_sqlite_file(
    project: Path, storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not postgres.is_postgres(storage_url):
        code, _, err = run("team", "init", cwd=project)
        assert code == 65 and "team mode runs on Postgres" in err
        return
    code, out, err = run("team", "init", "--json", cwd=project)
    assert code == 0, err
    assert any("memory_mcp_users" in line for line in json.loads(out)["done"])
    role = f"frank_{uuid.uuid4().hex[:8]}"
    try:
        code, out, _ = run(
            "team", "add-user", role, "--password-stdin", cwd=project, stdin="s3cret-pass\n"
        )
        assert code == 0 and f"{role}: role created (with the password given)" in out
        assert "s3cret" not in out
        code, out, _ = run("team", "add-user", role, "--url", storage_url, cwd=project)
        assert code == 0 and "role joined" in out
        code, _, err = run("team", "add-user", "bad name;", cwd=project)
        assert code == 65 and "user name" in err
    finally:
        anyio.run(postgres.drop_roles, storage_url, role)
