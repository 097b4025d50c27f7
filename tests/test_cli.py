"""The command line, through typer's CliRunner: output, JSON and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli import run
from helpers.model import MODEL_ENV, model_path
from helpers.storage import store_url
from memory_mcp import __version__


@pytest.fixture
def with_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODEL_ENV, str(model_path()))


@pytest.mark.usefixtures("with_model")
def test_store_then_search_from_the_repo_and_a_subdirectory_but_not_another_repo(
    project: Path, other_project: Path
) -> None:
    code, out, _ = run("store", "We deploy with GitHub Actions to Fly.io", cwd=project)
    assert code == 0 and "stored" in out
    for where in (project, project / "src" / "pkg"):
        code, out, _ = run("search", "how do we deploy", cwd=where)
        assert code == 0 and "We deploy with GitHub Actions to Fly.io" in out
    code, out, _ = run("search", "how do we deploy", cwd=other_project)
    assert code == 0 and "no memories found" in out
    code, _, _ = run("store", "--scope", "global", "The user prefers concise answers", cwd=project)
    assert code == 0
    for where in (project, other_project):
        code, out, _ = run("search", "concise answers", cwd=where)
        assert "The user prefers concise answers" in out


@pytest.mark.usefixtures("with_model")
def test_json_output_reports_the_fold_decision(project: Path) -> None:
    run("store", "The pigeon app's minimum iOS version is 15.", cwd=project)
    code, out, _ = run(
        "store", "--json", "The pigeon app's minimum iOS version is 16.", cwd=project
    )
    assert code == 0
    result = json.loads(out)
    assert result["action"] == "superseded" and result["related_content"].endswith("15.")
    code, out, _ = run("search", "--json", "pigeon iOS version", cwd=project)
    hits = json.loads(out)["results"]
    assert [h["content"] for h in hits] == ["The pigeon app's minimum iOS version is 16."]
    assert json.loads(out)["mode"] == "hybrid"
    # the hit says which older value it replaced (that one is history, not current)
    assert hits[0]["meta"]["supersedes"]["content"] == "The pigeon app's minimum iOS version is 15."
    code, out, _ = run("search", "pigeon iOS version", cwd=project)
    assert "supersedes" in out and "version is 15." in out


def test_bad_input_exits_with_a_message_and_a_meaningful_code(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    assert run("store", "--kind", "memo", "x", cwd=project)[0] == 65
    code, _, err = run("store", "   ", cwd=project)
    assert code == 65 and "content is empty" in err
    assert run("search", "x", "--limit", "0", cwd=project)[0] == 65
    code, _, err = run("forget", "f_missing", cwd=project)
    assert code == 66 and "no record" in err
    assert run("store", "--scope", "session", "x", cwd=project)[0] == 2
    assert run("import", str(project / "missing.jsonl"), cwd=project)[0] == 66


def test_a_configuration_error_exits_78(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_MCP_SEARCH_CANDIDATES", "lots")
    code, _, err = run("status", cwd=project)
    assert code == 78 and "search.candidates" in err


@pytest.mark.usefixtures("with_model")
def test_status_names_the_driver_and_the_embedder(project: Path) -> None:
    code, out, _ = run("status", cwd=project)
    assert code == 0
    assert "sqlite-vec" in out or "pgvector" in out  # the backend's vector extension
    assert "fastembed:sentence-transformers/all-MiniLM-L6-v2" in out
    code, out, _ = run("status", "--json", cwd=project)
    data = json.loads(out)
    assert data["vectors"] is True
    assert data["embedder"]["effective"] == "fastembed:sentence-transformers/all-MiniLM-L6-v2"
    assert data["embedder"]["degraded"] is False
    assert data["project"] == str(project.resolve())


def test_with_no_model_everything_works_on_the_bm25_floor_and_status_says_so(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "no-model-here"
    empty.mkdir()
    monkeypatch.setenv(MODEL_ENV, str(empty))
    code, out, _ = run("store", "Lint with ruff before committing", cwd=project)
    assert code == 0 and "lexical floor" in out
    code, out, err = run("search", "ruff lint", cwd=project)
    assert code == 0 and "Lint with ruff before committing" in out
    assert "lexical search only" in err
    code, out, _ = run("status", "--json", cwd=project)
    embedder = json.loads(out)["embedder"]
    assert embedder["effective"] == "bm25" and embedder["degraded"] is True
    assert "no ONNX model" in embedder["reason"]


@pytest.mark.usefixtures("with_model")
def test_export_import_and_reembed_round_trip(
    project: Path, tmp_path: Path, storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("store", "Use uv for installs", cwd=project)
    run("store", "--kind", "decision", "We chose SQLite over Postgres for the store", cwd=project)
    dump = tmp_path / "dump.jsonl"
    code, _, err = run("export", str(dump), cwd=project)
    assert code == 0 and "exported 2 records" in err
    monkeypatch.setenv("MEMORY_MCP_STORAGE_URL", store_url(tmp_path, storage_url, "second"))
    code, out, _ = run("import", "--json", str(dump), cwd=project)
    assert code == 0
    summary = json.loads(out)
    assert summary["records_added"] == 2 and summary["embedded"] == 2
    code, out, _ = run("reembed", "--json", cwd=project)
    assert code == 0 and json.loads(out)["remaining"] == 0
    code, out, _ = run("search", "why SQLite", cwd=project)
    assert "We chose SQLite over Postgres" in out


def test_push_copies_the_store_into_another_and_refuses_to_push_into_itself(
    project: Path, tmp_path: Path, storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    run("store", "Use uv for installs", cwd=project)
    run("store", "--kind", "decision", "We chose SQLite over Postgres for the store", cwd=project)
    team = store_url(tmp_path, storage_url, "team")
    code, out, _ = run("push", team, cwd=project)
    assert code == 0 and "copied 2 records (0 already there)" in out
    code, out, _ = run("push", "--json", team, cwd=project)
    assert code == 0 and json.loads(out)["records_skipped"] == 2
    here = json.loads(run("status", "--json", cwd=project)[1])["database"]
    itself = store_url(tmp_path, storage_url) if storage_url else f"sqlite://{here}"
    code, _, err = run("push", itself, cwd=project)
    assert code == 65 and "is this store" in err
    code, _, err = run("push", "mysql://host/db", cwd=project)
    assert code == 78 and "mysql" in err
    monkeypatch.setenv("MEMORY_MCP_STORAGE_URL", team)
    code, out, _ = run("search", "why SQLite", cwd=project)
    assert "We chose SQLite over Postgres" in out


@pytest.mark.usefixtures("with_model")
def test_bench_fold_prints_what_the_pipeline_did_per_label(
    tmp_path: Path, storage_url: str
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {
            "a": "The pigeon app's minimum iOS version is 15.",
            "b": "The pigeon app's minimum iOS version is 16.",
            "label": "update",
        },
        {"a": "Run tests with pytest -x", "b": "Never run tests with -x", "label": "contradiction"},
        {
            "a": "We deploy with GitHub Actions to Fly.io",
            "b": "Deploys to production go out via GitHub Actions onto Fly.io",
            "label": "duplicate",
        },
        {
            "a": "The Redis session TTL is 30 minutes.",
            "b": "Redis rate-limit counters use a 60-second window.",
            "label": "related",
        },
    ]
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    code, out, _ = run("bench", "fold", "--json", str(pairs))
    assert code == 0
    report = json.loads(out)
    assert report["counts"] == {
        "update": {"superseded": 1},
        "contradiction": {"conflict": 1},
        "duplicate": {"folded": 1},
        "related": {"inserted": 1},
    }
    assert report["fold_precision"] == 1.0
    code, out, _ = run("bench", "fold", str(pairs))
    assert code == 0 and "fold precision 1.000" in out

    # On a store a storage.url names: the same decisions; a store with records is refused.
    there = store_url(tmp_path, storage_url, "bench")
    code, out, _ = run("bench", "fold", "--json", "--storage", there, str(pairs))
    assert code == 0 and json.loads(out)["counts"] == report["counts"]
    code, _, stderr = run("bench", "fold", "--storage", there, str(pairs))
    assert code == 65 and "holds records" in stderr


@pytest.mark.usefixtures("with_model")
def test_bench_retrieval_writes_a_run_file_in_the_benchmark_format(
    tmp_path: Path, storage_url: str
) -> None:
    data = tmp_path / "data.jsonl"
    case = {
        "case": "t-000",
        "memories": [
            {
                "id": "m1",
                "text": "I adopted a beagle named Max last spring.",
                "time": "2023-05-01T10:00:00",
                "group": "s1",
            },
            {
                "id": "m2",
                "text": "My sister lives in Lisbon and teaches chemistry.",
                "time": "2023-05-02T10:00:00",
                "group": "s2",
            },
            {
                "id": "m3",
                "text": "I switched my commute to cycling in June.",
                "time": "2023-06-03T10:00:00",
                "group": "s3",
            },
        ],
        "queries": [
            {
                "id": "q0",
                "text": "What is my dog's name?",
                "time": "2023-07-01T00:00:00",
                "gold": ["m1"],
                "gold_groups": ["s1"],
                "category": "single-session-user",
            },
            {
                "id": "q1",
                "text": "How do I get to work?",
                "time": "2023-07-01T00:00:00",
                "gold": ["m3"],
                "gold_groups": ["s3"],
                "category": "single-session-user",
            },
        ],
    }
    data.write_text(json.dumps(case) + "\n", encoding="utf-8")
    run_file = tmp_path / "run.jsonl"
    code, out, _ = run("bench", "retrieval", str(data), "--out", str(run_file), "--json")
    assert code == 0
    lines = [json.loads(line) for line in run_file.read_text(encoding="utf-8").splitlines()]
    assert [(line["case"], line["query"]) for line in lines] == [("t-000", "q0"), ("t-000", "q1")]
    assert all(
        sorted(line["ranked"]) == ["m1", "m2", "m3"] for line in lines
    )  # every memory ranked
    assert lines[0]["ranked"][0] == "m1" and lines[1]["ranked"][0] == "m3"
    report = json.loads(out)
    assert report["metrics"]["overall"]["turn_recall@5"] == 100.0
    assert report["metrics"]["queries"] == 2

    # The run file alone scores the same, and a query without a run line counts as a miss.
    code, out, _ = run("bench", "score", str(data), str(run_file), "--json")
    assert code == 0 and json.loads(out)["metrics"] == report["metrics"]
    run_file.write_text(json.dumps(lines[0]) + "\n", encoding="utf-8")
    code, out, _ = run("bench", "score", str(data), str(run_file), "--json")
    scored = json.loads(out)
    assert code == 0 and scored["missing_queries"] == 1
    assert scored["metrics"]["overall"]["turn_recall@5"] == 50.0

    # On a store a storage.url names: the same ranking; a store with records is refused.
    there = store_url(tmp_path, storage_url, "bench")
    elsewhere = tmp_path / "there.jsonl"
    argv = ["bench", "retrieval", str(data), "--out", str(elsewhere), "--storage", there, "--json"]
    code, out, _ = run(*argv)
    assert code == 0 and json.loads(out)["metrics"] == report["metrics"]
    assert elsewhere.read_text(encoding="utf-8").splitlines()[1] == json.dumps(lines[1])
    code, _, stderr = run(*argv)
    assert code == 65 and "holds records" in stderr


def test_bench_score_refuses_a_malformed_run_file_with_exit_65(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"case": "c", "memories": [], "queries": []}) + "\n", "utf-8")
    bad = tmp_path / "run.jsonl"
    bad.write_text(json.dumps({"case": "c", "query": "q"}) + "\n", encoding="utf-8")
    code, _, stderr = run("bench", "score", str(data), str(bad))
    assert code == 65 and "run.jsonl:1: not a run line" in stderr
    code, _, stderr = run("bench", "score", str(data), str(tmp_path / "missing.jsonl"))
    assert code == 66 and "is not a file" in stderr


def test_version_and_a_missing_command() -> None:
    code, out, _ = run("--version")
    assert code == 0
    assert out.strip() == __version__
    code, _, err = run("--verbose")
    assert code == 2
    assert "memory-mcp --help" in err


def test_the_conflict_inbox_archive_and_restore(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")  # no model needed here
    run("store", "Run tests with pytest -x", cwd=project)
    code, out, _ = run("store", "--json", "Never run tests with -x", cwd=project)
    stored = json.loads(out)
    assert code == 0 and stored["action"] == "conflict"
    code, out, _ = run("conflicts", cwd=project)
    assert code == 0 and f"#{stored['conflict_id']}" in out
    assert "new" in out and "Never run tests with -x" in out and "Run tests with pytest -x" in out
    code, out, err = run("conflicts", "resolve", str(stored["conflict_id"]), "--keep", "old")
    assert code == 0 and "kept old" in out, err
    code, out, _ = run("conflicts", "resolve", str(stored["conflict_id"]), "--keep", "old")
    assert code == 65 and "already resolved" in _
    code, out, _ = run("conflicts", cwd=project)
    assert "no open conflicts" in out
    code, out, _ = run("archived", "--json", cwd=project)
    [archived] = json.loads(out)
    assert archived["id"] == stored["id"]
    assert archived["archived_reason"] == f"conflict-{stored['conflict_id']}"
    code, out, _ = run("restore", stored["id"], cwd=project)
    assert code == 0 and "restored" in out
    code, out, _ = run("restore", "f_NOPE", cwd=project)
    assert code == 66


def test_maintain_dry_run_project_done_and_status(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    run("store", "The staging database is called pigeon_stage", cwd=project)
    code, out, _ = run("maintain", "--dry-run", "--json", cwd=project)
    assert code == 0
    planned = json.loads(out)
    assert planned["dry_run"] and [t["task"] for t in planned["tasks"]] == [
        "secrets",
        "reembed",
        "consolidate",
        "insights",
        "staleness",
        "purge",
    ]
    code, out, _ = run("maintain", "--task", "purge", "--task", "staleness", cwd=project)
    assert code == 0 and "staleness" in out and "purge" in out and "consolidate" not in out
    code, out, _ = run("status", cwd=project)
    assert code == 0 and "maintenance" in out and "purge" in out and "just now" in out
    assert "now ago" not in out
    code, out, _ = run("maintain", "--task", "nope", cwd=project)
    assert code == 2
    code, out, _ = run("project", "done", "--dry-run", cwd=project)
    assert code == 0 and "would archive 1 records" in out
    code, out, _ = run("project", "done", cwd=project)
    assert code == 0 and "archived 1 records" in out
    code, out, _ = run("search", "staging database", cwd=project)
    assert "no memories found" in out


@pytest.mark.sqlite_only  # backs up and restores the SQLite file
def test_doctor_and_backup(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    run("store", "The staging database is called pigeon_stage", cwd=project)
    code, out, _ = run("doctor", cwd=project)
    assert code == 0 and "full-text index" in out and "PROBLEM" not in out
    code, out, _ = run("doctor", "--json", cwd=project)
    assert code == 0 and json.loads(out)["healthy"] is True
    target = tmp_path / "copy.db"
    code, out, _ = run("backup", str(target), cwd=project)
    assert code == 0 and "backed up to" in out and target.is_file()
    code, _, err = run("backup", str(target), cwd=project)
    assert code == 65 and "--force" in err
    monkeypatch.setenv("MEMORY_MCP_DATA_DIR", str(tmp_path))  # the copy, as a restored store
    target.rename(tmp_path / "memory.db")
    code, out, _ = run("search", "staging database", cwd=project)
    assert code == 0 and "pigeon_stage" in out


# What a new user met: plain answers ----------------------------------------------------


def test_json_output_uses_the_mcp_tools_field_names(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_mcp.mcp.tools import BriefOut, Forgotten, Found, Results, Stored

    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    code, out, _ = run("store", "--json", "Lint with ruff before committing", cwd=project)
    stored = json.loads(out)
    assert code == 0 and set(Stored.model_fields) <= set(stored)
    code, out, _ = run("search", "--json", "ruff lint", cwd=project)
    found = json.loads(out)
    assert set(found) == set(Results.model_fields)
    assert set(found["results"][0]) == set(Found.model_fields)
    code, out, _ = run("brief", "--json", cwd=project)
    assert set(BriefOut.model_fields) <= set(json.loads(out))
    code, out, _ = run("forget", "--json", stored["id"], cwd=project)
    assert set(json.loads(out)) == set(Forgotten.model_fields)


def test_help_shows_flags_as_flags() -> None:
    code, out, _ = run("search", "--help")
    assert code == 0 and "--json" in out
    assert "<bool>" not in out


def test_cwd_may_be_relative(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    run("store", "Docs live in docs/", cwd=project)
    code, out, err = run("search", "--cwd", ".", "docs", cwd=project / "src")
    assert code == 0 and "Docs live in docs/" in out, err
    code, out, _ = run("status", "--cwd", "..", "--json", cwd=project / "src")
    assert code == 0 and json.loads(out)["project"] == str(project.resolve())


def test_a_conflict_is_resolved_by_the_number_it_is_listed_with_and_marked_meanwhile(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    run("store", "Run tests with pytest -x", cwd=project)
    code, out, _ = run("store", "--json", "Never run tests with -x", cwd=project)
    number = json.loads(out)["conflict_id"]
    code, out, _ = run("search", "run tests", cwd=project)
    assert out.count(f"CONFLICT #{number}") == 2  # each side names the other
    code, out, _ = run("search", "--json", "run tests", cwd=project)
    assert {h["meta"]["conflict"]["id"] for h in json.loads(out)["results"]} == {number}
    code, out, _ = run("brief", cwd=project)
    assert out.count(f"disputed (conflict #{number})") == 2
    code, out, err = run("conflicts", "resolve", f"#{number}", "--keep", "new", cwd=project)
    assert code == 0 and "resolved" in out, err
    code, out, _ = run("search", "run tests", cwd=project)
    assert "CONFLICT" not in out


def test_search_finds_ingested_documents_with_their_path_and_heading(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    (project / "README.md").write_text(
        "# App\n\n## Release\n\nTag the commit, then run make publish.\n", encoding="utf-8"
    )
    assert run("ingest", cwd=project)[0] == 0
    code, out, _ = run("search", "how do we publish a release", cwd=project)
    assert code == 0 and "make publish" in out and "README.md > App > Release" in out
    code, out, _ = run("search", "--json", "how do we publish a release", cwd=project)
    [hit] = json.loads(out)["results"]
    assert hit["corpus"] == "knowledge" and hit["meta"]["path"] == "README.md"


def test_without_a_model_and_offline_reembed_fails_at_once_saying_how_to_provide_one(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MODEL_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_CACHE_DIR", str(tmp_path / "no-models"))
    code, _, err = run("reembed", cwd=project)
    assert code == 69
    assert "not on this machine" in err and "embedder.model_path" in err
    assert "download" not in err.replace("cannot be downloaded", "")
    code, out, _ = run("status", cwd=project)
    assert "embedder.model_path" in out and "downloading" not in out


@pytest.mark.sqlite_only  # the WAL files beside the default SQLite file
def test_the_backup_hint_says_to_remove_the_wal_files(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    run("store", "Something to keep", cwd=project)
    code, out, _ = run("backup", str(tmp_path / "copy.db"), cwd=project)
    assert code == 0 and "memory.db-wal" in out and "memory.db-shm" in out


def test_the_cli_task_list_is_maintenances() -> None:
    from memory_mcp.cli.upkeep import Task
    from memory_mcp.maintenance import TASKS

    assert [t.value for t in Task] == list(TASKS)


def test_install_and_uninstall_all_and_what_they_say(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    code, out, err = run("install", "all", "--hook", cwd=project)
    assert code == 0, err
    for path in (".claude.json", ".codex/config.toml", ".gemini/settings.json"):
        assert f"{home / path}: " in out
    assert "to do: Codex runs a new hook only after you trust it" in out
    assert "to do: Gemini CLI turns MCP servers and hooks off" in out
    code, out, _ = run("status", "--json", cwd=project)
    agents = {a["agent"]: a for a in json.loads(out)["agents"]}
    assert all(a["servers"] == ["user"] and a["hooks"] == ["user"] for a in agents.values())
    code, out, _ = run("status", cwd=project)
    assert "to do (codex)" in out and "to do (gemini)" in out
    code, out, err = run("uninstall", "all", cwd=project)
    assert code == 0, err
    assert [p for p in home.rglob("*") if p.is_file()] == []


def test_run_starts_one_cli_and_touches_nothing_when_it_is_missing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    run("store", "Docs live in docs/", cwd=project)
    code, _, err = run("run", "all", cwd=project)
    assert code == 2 and "all" in err
    monkeypatch.setenv("PATH", str(project))  # no claude here
    code, _, err = run("run", "claude", cwd=project)
    assert code == 127 and "claude is not installed" in err
    assert not (project / "CLAUDE.md").exists()


def test_the_hook_stays_silent_when_the_prompt_file_already_has_the_brief(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    run("store", "Docs live in docs/", cwd=project)
    code, out, _ = run("brief", "--hook", "--agent", "claude", cwd=project)
    context = json.loads(out)["hookSpecificOutput"]["additionalContext"]
    assert code == 0 and "Docs live in docs/" in context
    run("inject", "--agent", "claude", cwd=project)  # what `run claude` does first
    code, out, _ = run("brief", "--hook", "--agent", "claude", cwd=project)
    assert code == 0 and json.loads(out) == {}
    code, out, _ = run("brief", "--hook", "--agent", "gemini", cwd=project)
    assert "Docs live in docs/" in json.loads(out)["hookSpecificOutput"]["additionalContext"]


def test_only_status_asks_the_network_whether_a_missing_model_could_be_downloaded(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SessionStart hook must not wait on a connection it does not need."""
    import socket

    calls: list[object] = []

    def unreachable(address: object, *args: object, **kwargs: object) -> socket.socket:
        calls.append(address)
        raise OSError("network is unreachable")

    monkeypatch.delenv(MODEL_ENV, raising=False)
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_CACHE_DIR", str(tmp_path / "no-models"))
    monkeypatch.setattr(socket, "create_connection", unreachable)
    for command in (["brief"], ["brief", "--hook"], ["inject"], ["conflicts"]):
        assert run(*command, cwd=project)[0] == 0
    assert calls == []
    code, out, _ = run("status", cwd=project)
    assert code == 0 and calls == [("huggingface.co", 443)]
    assert "cannot be downloaded: huggingface.co cannot be reached" in out
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    code, out, _ = run("status", cwd=project)
    assert len(calls) == 1 and "the first command or server that needs it downloads it" in out


def test_install_all_goes_on_past_a_broken_file_and_says_which(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text("model = \n")
    monkeypatch.setenv("HOME", str(home))
    code, out, err = run("install", "all", cwd=project)
    assert code == 65
    assert f"{home / '.claude.json'}: MCP server 'memory' added" in out
    assert f"{home / '.gemini' / 'settings.json'}: MCP server 'memory' added" in out
    assert "error (codex):" in err and "not valid TOML" in err


def test_the_benches_never_write_into_the_store_the_settings_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store no bench may touch: nothing listens there, so a bench that opened it fails.
    monkeypatch.setenv("MEMORY_MCP_STORAGE_URL", "postgresql://127.0.0.1:1/team")
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"a": "Use uv", "b": "use UV", "label": "duplicate"}) + "\n")
    assert run("bench", "fold", str(pairs))[0] == 0
    data = tmp_path / "data.jsonl"
    case = {
        "case": "c",
        "memories": [{"id": "m1", "text": "My dog is Rex.", "time": "2023-01-01T00:00:00"}],
        "queries": [{"id": "q", "text": "dog", "time": "2023-02-01T00:00:00", "gold": ["m1"]}],
    }
    data.write_text(json.dumps(case) + "\n")
    assert run("bench", "retrieval", str(data), "--out", str(tmp_path / "run.jsonl"))[0] == 0
    code, _, _ = run("bench", "perf", "--sizes", "20", "--samples", "5", "--no-launch")
    assert code == 0
