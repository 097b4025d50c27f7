"""The viewer's pages over HTTP, in process: what they show, what they change, and what
they refuse (another host, another site, a missing form token, no sign-in)."""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from memory_mcp.config import ServeSettings
from memory_mcp.mcp.tokens import Tokens, digest
from memory_mcp.mcp.transports import transport_security
from memory_mcp.records import CORPORA
from memory_mcp.scope import project_label
from memory_mcp.service import MemoryService
from memory_mcp.storage.base import Filters
from memory_mcp.viewer.app import build_app
from memory_mcp.viewer.guard import POLICY

pytestmark = pytest.mark.anyio
BASE = "http://127.0.0.1:8766"
SCRIPT = "<script>document.title='ran'</script> deploys need the VPN"
# made-up words: texts of five of them share little, so none folds into another
WORDS = [
    a + b
    for a in ("ka", "lo", "mi", "nu", "pe")
    for b in ("bar", "cot", "dun", "fel", "gir", "hum", "jex", "kov")
]


@pytest.fixture
async def client(memory: MemoryService, project: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(
        memory,
        tokens=Tokens("", None),
        security=transport_security(ServeSettings()),
        root=project,
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        yield c


def form_token(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "the page has a form token"
    return found.group(1)


async def key_of(memory: MemoryService, project: Path) -> str:
    return (await memory.engine.project(project)).key


async def test_the_pages_show_the_store_as_text_under_a_strict_policy(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    stored = await memory.store(SCRIPT, kind="gotcha", cwd=project, agent="claude")
    await memory.store("The API listens on port 8080", cwd=project, agent="codex")
    key = await key_of(memory, project)
    for path, wanted in [
        ("/", "2</strong> memories"),
        (f"/project?key={key}", "deploys need the VPN"),
        (f"/project?key={key}&agent=codex", "port 8080"),
        (f"/project?key={key}&q=VPN+deploys", "score <strong>"),
        (f"/record/{stored.id}", "Provenance"),
        (f"/brief?key={key}", "tokens"),
        ("/conflicts", "No open conflicts"),
        ("/archived", "Nothing archived"),
        ("/maintenance", "Tasks"),
    ]:
        page = await client.get(path)
        assert page.status_code == 200, path
        assert wanted in page.text, path
        assert page.headers["content-security-policy"] == POLICY
        assert "<script" not in page.text, path  # no script of ours, none of a memory
    listed = (await client.get(f"/project?key={key}")).text
    assert "&lt;script&gt;document.title=&#39;ran&#39;&lt;/script&gt;" in listed
    assert "port 8080" not in (await client.get(f"/project?key={key}&agent=claude")).text


async def test_archive_and_restore_change_the_store(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    stored = await memory.store("Cache the wheels in CI", cwd=project)
    page = await client.get(f"/record/{stored.id}")
    csrf = form_token(page.text)
    done = await client.post(
        f"/record/{stored.id}/forget",
        data={"reason": "we stopped caching", "csrf": csrf},
        headers={"Origin": BASE},
    )
    assert done.headers["location"] == f"/record/{stored.id}?done=archived"
    assert (await memory.get(stored.id)).archived_reason == "we stopped caching"
    assert "Archived: Restore brings it back" in (await client.get(done.headers["location"])).text
    assert "Cache the wheels in CI" in (await client.get("/archived")).text
    back = await client.post(
        "/restore", data={"id": stored.id, "csrf": csrf, "back": "//evil.example/"}
    )
    assert back.status_code == 303 and back.headers["location"] == "/archived?done=restored"
    assert (await memory.get(stored.id)).current


async def test_undoing_a_fold_brings_the_absorbed_text_back_as_its_own_record(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    first = await memory.store("Use uv for installs.", cwd=project)
    second = await memory.store("use UV for installs", cwd=project)
    assert second.action == "folded"
    page = await client.get(f"/record/{second.id}")
    assert "Undo this fold" in page.text and "Use uv for installs." in page.text
    absorbed = (await client.get(f"/record/{first.id}")).text
    assert f'into <a href="/record/{second.id}">' in absorbed
    assert "Supersede chain" not in absorbed  # a fold is not a newer value
    undone = await client.post(
        "/restore",
        data={"id": first.id, "csrf": form_token(page.text), "back": f"/record/{second.id}"},
    )
    assert undone.headers["location"] == f"/record/{second.id}?done=unfolded"
    assert "Fold undone" in (await client.get(undone.headers["location"])).text
    assert (await memory.get(first.id)).current
    assert (await memory.get(second.id)).merged_from == []


async def test_a_conflict_is_resolved_from_the_inbox(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    old = await memory.store("Run tests with pytest -x", cwd=project)
    new = await memory.store("Never run tests with -x", cwd=project)
    assert new.conflict_id is not None
    inbox = await client.get("/conflicts")
    assert "Run tests with pytest -x" in inbox.text and "Never run tests with -x" in inbox.text
    csrf = form_token(inbox.text)
    key = await key_of(memory, project)
    marker = f'href="/conflicts#c{new.conflict_id}" class="badge conflict"'
    for listed in (f"/project?key={key}", f"/project?key={key}&q=run+tests+pytest"):
        assert (await client.get(listed)).text.count(marker) == 2, listed  # both sides
    bad = await client.post(f"/conflicts/{new.conflict_id}", data={"keep": "x", "csrf": csrf})
    assert bad.status_code == 400 and "keep must be one of" in bad.text
    empty = await client.post(
        f"/conflicts/{new.conflict_id}", data={"keep": "merged", "text": "  ", "csrf": csrf}
    )
    assert empty.status_code == 400 and "write the text that replaces both" in empty.text
    assert "Never run tests with -x" in empty.text  # the inbox, not a bare error page
    done = await client.post(f"/conflicts/{new.conflict_id}", data={"keep": "old", "csrf": csrf})
    assert done.headers["location"] == f"/conflicts?done=resolved-old&n={new.conflict_id}"
    told = (await client.get(done.headers["location"])).text
    assert f"Conflict #{new.conflict_id} resolved: the older memory is kept" in told
    assert (await memory.get(new.id)).archived_reason == f"conflict-{new.conflict_id}"
    assert (await memory.get(old.id)).current
    assert "No open conflicts" in (await client.get("/conflicts")).text
    set_aside = (await client.get(f"/record/{new.id}")).text
    assert f"set aside when conflict #{new.conflict_id} was resolved" in set_aside
    # Restoring the side set aside brings the contradiction, and the conflict, back.
    again = await client.post(
        "/restore", data={"id": new.id, "csrf": csrf, "back": f"/record/{new.id}"}
    )
    assert again.headers["location"].endswith(f"done=reopened&n={new.conflict_id}")
    assert (
        f"conflict #{new.conflict_id} is open again"
        in (await client.get(again.headers["location"])).text
    )
    assert "Never run tests with -x" in (await client.get("/conflicts")).text


async def test_requests_from_elsewhere_are_refused_and_change_nothing(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    stored = await memory.store("Deploy from the main branch only", cwd=project)
    csrf = form_token((await client.get(f"/record/{stored.id}")).text)
    forget = f"/record/{stored.id}/forget"
    refusals = [
        ({"reason": "x"}, {}, 403),  # no form token
        ({"reason": "x", "csrf": "0" * 64}, {}, 403),  # a made-up one
        # another site's page, even on this machine
        ({"reason": "x", "csrf": csrf}, {"Origin": "http://127.0.0.1:9999"}, 403),
        ({"reason": "x", "csrf": csrf}, {"Origin": "https://evil.example"}, 403),
        ({"reason": "x", "csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}, 403),
        ({"reason": "x", "csrf": csrf}, {"Host": "evil.example"}, 421),  # DNS rebinding
    ]
    for data, headers, status in refusals:
        answer = await client.post(forget, data=data, headers=headers)
        assert answer.status_code == status, (data, headers)
    assert (await client.get("/", headers={"Host": "evil.example:8766"})).status_code == 421
    assert (await memory.get(stored.id)).current


async def test_with_tokens_a_browser_signs_in_and_sees_only_what_its_user_may(
    memory: MemoryService, project: Path, tmp_path: Path
) -> None:
    app, _ = await team(memory, project, tmp_path)
    with MemoryService.acting_as("alice"):
        mine = await memory.store("My editor is helix", cwd=project, private=True)
        shared = await memory.store("The staging database is read-only", cwd=project)
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as bob:
        first = await bob.get("/")
        assert first.status_code == 303 and first.headers["location"] == "/sign-in"
        deep = await bob.get(f"/record/{shared.id}")  # signed in, back to the page asked for
        assert deep.headers["location"] == f"/sign-in?next=%2Frecord%2F{shared.id}"
        form = await bob.get(deep.headers["location"])
        assert f'action="/sign-in?next=%2Frecord%2F{shared.id}"' in form.text
        elsewhere = await bob.post(
            "/sign-in?next=//evil.example/", data={"token": "bob-token-0123456789ab"}
        )
        assert elsewhere.headers["location"] == "/"
        assert (await bob.post("/sign-in", data={"token": "wrong"})).status_code == 401
        signed = await bob.post(
            f"/sign-in?next=%2Frecord%2F{shared.id}", data={"token": "bob-token-0123456789ab"}
        )
        assert signed.status_code == 303 and signed.headers["location"] == f"/record/{shared.id}"
        assert "httponly" in signed.headers["set-cookie"].lower()
        assert "samesite=strict" in signed.headers["set-cookie"].lower()
        key = await key_of(memory, project)
        listed = (await bob.get(f"/project?key={key}")).text
        assert "staging database" in listed and "helix" not in listed
        assert (await bob.get(f"/record/{mine.id}")).status_code == 404
        assert (await bob.get(f"/record/{shared.id}")).status_code == 200
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as alice:
        page = await alice.get(
            f"/record/{mine.id}", headers={"Authorization": "Bearer alice-token-0123456789"}
        )
        assert page.status_code == 200 and "helix" in page.text


async def test_an_older_value_is_made_current_again_from_its_chain(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    old = await memory.store("The pigeon app's minimum iOS version is 15.", cwd=project)
    new = await memory.store("The pigeon app's minimum iOS version is 16.", cwd=project)
    assert new.action == "superseded"
    page = await client.get(f"/record/{new.id}")
    assert "Supersede chain" in page.text and "version is 15." in page.text
    assert "replaced, written" in page.text and page.text.count("Make this current again") == 1
    done = await client.post(f"/record/{old.id}/reinstate", data={"csrf": form_token(page.text)})
    assert done.headers["location"] == f"/record/{old.id}?done=reinstated"
    # The chain is told by what replaced what, not by when each was written.
    later = (await client.get(f"/record/{new.id}")).text
    assert "the current value, written" in later and "a later value" not in later
    back, replaced = await memory.get(old.id), await memory.get(new.id)
    assert back.current and back.supersedes == [new.id]
    assert replaced.replaced_by == old.id and replaced.archived_at is None
    hits = (await memory.search("pigeon minimum iOS version", cwd=project)).hits
    assert [h.record.id for h in hits] == [old.id]
    again = await client.post(f"/record/{old.id}/reinstate", data={"csrf": form_token(page.text)})
    assert again.status_code == 400 and "already current" in again.text


async def test_the_pages_of_a_project_list_every_record_once_newest_first(
    client: httpx.AsyncClient,
    memory: MemoryService,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Page after page, across corpora, with a run of records written at one instant
    spanning the pages' boundary."""
    from datetime import UTC, datetime, timedelta

    start = datetime(2026, 1, 1, tzinfo=UTC)
    times = (
        [start + timedelta(minutes=i) for i in range(40)]
        + [start + timedelta(days=1)] * 45  # one instant
        + [start + timedelta(days=2, minutes=i) for i in range(35)]
    )
    now = [start]
    monkeypatch.setattr(memory.engine, "clock", lambda: now[0])
    ids = set()
    for i, at in enumerate(times):
        now[0] = at
        kind = "journal" if i % 3 == 0 else "fact"
        words = random.Random(i).sample(WORDS, 5)
        ids.add((await memory.store(" ".join(words), kind=kind, cwd=project)).id)
    current = await memory.engine.store.current(
        Filters(scope_keys=(await key_of(memory, project),), corpora=CORPORA), 500
    )
    assert {r.id for r in current} == ids  # nothing folded: 120 records to page through
    key = await key_of(memory, project)
    shown: list[str] = []
    times_shown: list[str] = []
    url: str | None = f"/project?key={key}"
    pages = 0
    while url:
        page = (await client.get(url)).text
        pages += 1
        shown += re.findall(r'<a href="/record/([^"]+)" class="id">', page)
        times_shown += re.findall(r'<time datetime="([^"]+)"', page)
        found = re.search(r'href="([^"]+)" rel="next"', page)
        url = found.group(1).replace("&amp;", "&") if found else None
    assert pages == 3
    assert len(shown) == len(set(shown)) == 120 and set(shown) == ids
    assert times_shown == sorted(times_shown, reverse=True)


async def test_the_projects_page_counts_what_was_written_since_it_was_last_shown(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    await memory.store("The API listens on port 8080", cwd=project)
    assert "1</strong> memory ·" in (await client.get("/")).text
    assert "1</strong> memory ·" in (await client.get("/")).text  # kept while nothing changed
    await memory.store("Releases are tagged by the release job", cwd=project)
    assert "2</strong> memories" in (await client.get("/")).text


async def test_archived_records_come_a_page_at_a_time(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    for i in range(53):
        words = " ".join(random.Random(1000 + i).sample(WORDS, 5))
        stored = await memory.store(words, cwd=project)
        await memory.forget(stored.id, reason="done with it")
    first = (await client.get("/archived")).text
    assert first.count("done with it") == 50
    older = re.search(r'href="([^"]+)" rel="next"', first)
    assert older
    second = (await client.get(older.group(1).replace("&amp;", "&"))).text
    assert second.count("done with it") == 3 and 'rel="next"' not in second
    assert (await client.get("/archived?from=x")).status_code == 400


async def team(memory: MemoryService, project: Path, tmp_path: Path) -> tuple[object, Path]:
    """The viewer of a server with a tokens file naming alice and bob."""
    tokens_file = tmp_path / "tokens.toml"
    tokens_file.write_text(
        f'[users]\nalice = "{digest("alice-token-0123456789")}"\n'
        f'bob = "{digest("bob-token-0123456789ab")}"\n'
    )
    app = build_app(
        memory,
        tokens=Tokens("", tokens_file),
        security=transport_security(ServeSettings()),
        root=project,
    )
    return app, tokens_file


@asynccontextmanager
async def signed_in(app: object, token: str) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        assert (await client.post("/sign-in", data={"token": token})).status_code == 303
        yield client


async def test_one_user_never_reaches_anothers_personal_records_or_conflicts(
    memory: MemoryService, project: Path, tmp_path: Path
) -> None:
    app, _ = await team(memory, project, tmp_path)
    with MemoryService.acting_as("alice"):
        gone = await memory.store("My staging password hint is the cat", cwd=project, private=True)
        await memory.forget(gone.id, reason="not needed")
        old = await memory.store("I run tests with pytest -x", cwd=project, private=True)
        new = await memory.store("I never run tests with -x", cwd=project, private=True)
    assert new.conflict_id is not None
    async with signed_in(app, "bob-token-0123456789ab") as bob:
        assert "password hint" not in (await bob.get("/archived")).text
        assert "No open conflicts" in (await bob.get("/conflicts")).text
        csrf = form_token((await bob.get("/archived")).text)
        for keep in ("old", "merged"):
            answer = await bob.post(
                f"/conflicts/{new.conflict_id}", data={"keep": keep, "text": "x", "csrf": csrf}
            )
            assert answer.status_code == 404 and old.id not in answer.text
        assert (
            await bob.post(f"/conflicts/{1 << 63}", data={"keep": "old", "csrf": csrf})
        ).status_code == 404
        assert "0 open conflicts" not in (await bob.get("/")).text
    assert (await memory.get(old.id)).current and (await memory.get(new.id)).current
    async with signed_in(app, "alice-token-0123456789") as alice:
        assert "never run tests" in (await alice.get("/conflicts")).text


async def test_a_session_ends_when_its_token_goes_or_its_user_signs_out(
    memory: MemoryService, project: Path, tmp_path: Path
) -> None:
    app, tokens_file = await team(memory, project, tmp_path)
    async with (
        signed_in(app, "bob-token-0123456789ab") as bob,
        signed_in(app, "alice-token-0123456789") as alice,
    ):
        assert (await bob.get("/")).status_code == 200
        tokens_file.write_text(f'[users]\nalice = "{digest("alice-token-0123456789")}"\n')
        os.utime(tokens_file, (time.time() + 5, time.time() + 5))  # read again: it changed
        assert (await bob.get("/")).status_code == 303  # bob is out at once
        page = await alice.get("/")
        assert page.status_code == 200 and "Sign out" in page.text
        out = await alice.post("/sign-out", data={"csrf": form_token(page.text)})
        assert out.status_code == 303 and out.headers["location"] == "/sign-in"
        assert (await alice.get("/")).status_code == 303


async def test_the_stylesheet_needs_no_sign_in_and_a_huge_form_is_refused(
    memory: MemoryService, project: Path, tmp_path: Path
) -> None:
    app, _ = await team(memory, project, tmp_path)
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as anyone:
        css = await anyone.get("/static/viewer.css")
        assert css.status_code == 200 and "immutable" in css.headers["cache-control"]
        assert (await anyone.get("/static/nothing.css")).headers["cache-control"] == "no-store"
        assert (await anyone.get("/")).headers["cache-control"] == "no-store"
        huge = await anyone.post("/sign-in", data={"token": "x" * (2 << 20)})
        assert huge.status_code == 413


async def test_the_global_scope_has_its_own_archive_and_no_brief_of_its_own(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    mine = await memory.store("Deploy notes live in the wiki", cwd=project)
    everywhere = await memory.store("The user prefers concise answers", scope="global")
    await memory.forget(mine.id, reason="moved")
    await memory.forget(everywhere.id, reason="changed their mind")
    await memory.store("Releases are tagged by the release job", cwd=project)
    await memory.store("The user writes British English", scope="global")
    front = (await client.get("/")).text
    assert "/brief?key=" in front and 'href="/brief"' not in front
    archived = (await client.get("/archived?global=1")).text
    assert "changed their mind" in archived and "moved" not in archived
    assert "moved" in (await client.get("/archived")).text
    refused = await client.get("/brief")
    assert refused.status_code == 400 and "has no brief of its own" in refused.text


async def test_a_bad_kind_or_time_is_a_sentence_saying_what_to_change(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    stored = await memory.store("Deploys need the VPN", cwd=project, agent="codex")
    key = await key_of(memory, project)
    for query, said in [
        ("kind=bogus", "unknown kind 'bogus'"),
        ("kind=bogus&agent=codex", '<option value="bogus" selected>bogus (unknown)</option>'),
        ("kind=bogus&q=deploys", "unknown kind 'bogus'"),
        ("since=notadate", "since must be"),
        ("until=notadate&q=deploys", "until must be"),
        ("since=2026-03-02&until=2026-03-01&agent=codex", "since (2026-03-02) is not before until"),
        ("since=2026-03-02T10:00&until=2026-03-02T09:00", "is not before until"),
    ]:
        page = await client.get(f"/project?key={key}&{query}")
        assert page.status_code == 400, query
        text = page.text.replace("&#39;", "'")
        assert said in text and 'role="alert"' in text, query
        assert 'value="codex"' in text or "agent=" not in query, query  # the filters stay
    missing = await client.get("/project?key=/nowhere/.git")
    assert missing.status_code == 404 and "no project '/nowhere/.git'" in missing.text.replace(
        "&#39;", "'"
    )
    # A date picked as "until" takes in that whole day.
    today = (await memory.get(stored.id)).created_at[:10]
    listed = await client.get(f"/project?key={key}&since={today}&until={today}")
    assert listed.status_code == 200 and "Deploys need the VPN" in listed.text


async def test_pages_name_projects_times_and_who_runs_maintenance_plainly(
    client: httpx.AsyncClient, memory: MemoryService, project: Path
) -> None:
    stored = await memory.store("The API listens on port 8080", cwd=project)
    key = await key_of(memory, project)
    front = (await client.get("/")).text
    assert f">{project_label(key)}</a></h2>" in front
    record = (await client.get(f"/record/{stored.id}")).text
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", record)
    assert not re.search(r">[^<]*\d\d:\d\d:\d\d\.\d+", record)  # no raw stored times
    maintenance = (await client.get("/maintenance")).text
    assert "This viewer runs no task" in maintenance
    icon = await client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"


async def test_a_projects_search_reads_the_global_scope_as_an_agents_does(
    client: httpx.AsyncClient,
    memory: MemoryService,
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await memory.store("Deploys go through the release job", cwd=project, tags=["ci"])
    await memory.store("The user prefers tabs over spaces in every repository", scope="global")
    key = await key_of(memory, project)
    found = (await client.get(f"/project?key={key}&q=tabs+spaces")).text
    assert "prefers tabs over spaces" in found and "· <strong>global</strong>" in found
    assert "prefers tabs" not in (await client.get(f"/project?key={key}")).text  # its own list
    tagged = (await client.get(f"/project?key={key}&tag=%23ci")).text  # as pages show tags
    assert (
        "release job" in tagged
        and f'href="/project?key={quote(key, safe="")}&amp;tag=ci"' in tagged
    )
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no CLI set up for this user
    brief = (await client.get(f"/brief?key={key}")).text
    assert brief.count("not delivered in this project yet") == 3
