"""The viewer in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright, against ``memory-mcp ui`` as a process on a store the real model wrote.

It opens the pages, searches, undoes a fold, resolves a conflict, restores an
archived record and checks the store changed (through the CLI); a stored
``<script>`` shows as text and never runs; a form on another site that posts to
the viewer is refused. Screenshots of the main pages go to the test's folder, and
to ``$SCREENSHOTS_DIR`` when set (the README's come from there).

Never skipped: without Chromium the tests fail and say how to install it.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.processes import COMMAND
from helpers.serving import running

pytestmark = [pytest.mark.browser, pytest.mark.model]
SCRIPT = "<script>document.title='ran'</script>Deploys need the VPN; the script tag is text"
SEED = """
import asyncio, json, sys
from memory_mcp.config import load_settings
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService

async def main() -> None:
    texts = json.loads(sys.argv[1])
    settings = load_settings(project_root=project_root())
    async with MemoryService.open(settings, wait_for_embedder=60) as m:
        out = {}
        for name, text, kind, agent in texts:
            out[name] = (await m.store(text, kind=kind, agent=agent)).id
        print(json.dumps(out))

asyncio.run(main())
"""
MEMORIES = [
    ("script", SCRIPT, "gotcha", "claude"),
    ("port", "The API listens on port 8080 behind nginx", "fact", "codex"),
    ("first", "Run the linter with make lint before pushing", "procedure", "claude"),
    ("folded", "Run the linter with make lint before a push", "procedure", "gemini"),
    ("old", "Run tests with pytest -x", "procedure", "codex"),
    ("new", "Never run tests with -x", "procedure", "claude"),
    ("gone", "Cache the wheels in CI", "decision", "codex"),
]


def chromium() -> str:
    found = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium")
    if not found:
        pytest.fail(
            "no Chromium: install Debian's `chromium` package (apt-get install chromium), or "
            "set CHROMIUM_PATH to a Chromium executable; .ci/run installs it"
        )
    return found


def cli(env: dict[str, str], cwd: Path, *argv: str) -> Any:
    done = subprocess.run(
        [COMMAND, *argv, "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def viewer(env: dict[str, str], project: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """``memory-mcp ui`` on a free port over a seeded store: its URL and the ids stored."""
    (project / ".memory-mcp.toml").write_text('[project]\nid = "github.com/acme/shop"\n')
    seeded = subprocess.run(
        [sys.executable, "-c", SEED, json.dumps(MEMORIES)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert seeded.returncode == 0, seeded.stderr
    ids: dict[str, str] = json.loads(seeded.stdout)
    cli(env, project, "forget", ids["gone"], "--reason", "we stopped caching")
    with running(env, project, "ui", "--port", "0") as process:
        assert process.stderr is not None
        line = process.stderr.readline().decode()
        found = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert found, line + (process.stderr.read().decode() if process.poll() is not None else "")
        yield found.group(1), ids


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium(), args=args)
        try:
            yield launched
        finally:
            launched.close()


def shoot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    if folder := os.environ.get("SCREENSHOTS_DIR"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / f"{name}.png", Path(folder) / f"{name}.png")


def press(page: Any, name: str, within: str = "main") -> None:
    """Click a button that submits a form, and wait for the page the answer leads to."""
    with page.expect_navigation():
        page.locator(within).get_by_role("button", name=name).first.click()


def test_curating_the_memory_in_a_browser(
    viewer: tuple[str, dict[str, str]],
    browser: Any,
    env: dict[str, str],
    project: Path,
    tmp_path: Path,
) -> None:
    url, ids = viewer
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if m.type == "error" else None)

    page.goto(url)
    assert page.locator("h1").inner_text() == "Projects"
    assert "7 memories" not in page.content()  # one was archived: 6 current, one folded
    shoot(page, tmp_path, "projects")
    with page.expect_navigation():
        page.get_by_role("link", name="Memories").first.click()
    assert page.get_by_text("<script>document.title='ran'</script>", exact=False).count() == 1
    assert page.title() != "ran"
    page.get_by_label("Search").fill("linter before pushing")
    page.get_by_label("Search").press("Enter")
    page.wait_for_url(re.compile(r"q=linter"))
    assert "score" in page.locator(".hits").inner_text()
    shoot(page, tmp_path, "search")

    page.goto(f"{url}record/{ids['folded']}")
    assert "Folded into it (1)" in page.content()
    shoot(page, tmp_path, "record")
    press(page, "Undo this fold")
    assert "Folded into it" not in page.content()
    assert "Fold undone" in page.locator("[role=status]").inner_text()
    # Maintenance's consolidation, which would fold the two, leaves them apart.
    [swept] = cli(env, project, "maintain", "--task", "consolidate")["tasks"]
    assert swept["counts"] == {}, swept
    page.goto(f"{url}record/{ids['first']}")
    assert "Archived" not in page.locator("main").inner_text()

    page.goto(f"{url}conflicts")
    assert "Never run tests with -x" in page.content()
    shoot(page, tmp_path, "conflicts")
    press(page, "Keep the older")
    assert "No open conflicts" in page.content()
    assert cli(env, project, "conflicts") == []

    page.goto(f"{url}archived")
    assert "Cache the wheels in CI" in page.content()
    press(page, "Restore", within=".archived:has-text('Cache the wheels in CI')")
    archived = cli(env, project, "archived")
    assert ids["gone"] not in {r["id"] for r in archived}

    brief_key = re.search(r'href="/brief\?key=([^"]+)"', (page.goto(url) and page.content()) or "")
    assert brief_key
    page.goto(f"{url}brief?key={brief_key.group(1)}")
    assert "tokens" in page.content()
    shoot(page, tmp_path, "brief")
    # From the keyboard: the skip link first, then every field of the filters in order.
    page.goto(f"{url}project?key={brief_key.group(1)}")
    focused: list[str] = []
    for _ in range(24):
        page.keyboard.press("Tab")
        focused.append(
            page.evaluate("document.activeElement.id || document.activeElement.textContent")
        )
    assert focused[0] == "Skip to content"
    wanted = ["q", "kind", "agent", "tag", "since", "until", "Show"]
    # (a date field takes a Tab for each of its parts: each field counts once)
    assert [f for f in dict.fromkeys(focused) if f in wanted] == wanted, focused
    page.set_viewport_size({"width": 375, "height": 800})  # a phone
    page.goto(f"{url}project?key={brief_key.group(1)}")
    shoot(page, tmp_path, "narrow")
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    for field in ("q", "kind", "agent", "tag", "since", "until"):  # each label over its field
        label = page.locator(f"label[for={field}]").bounding_box()
        box = page.locator(f"#{field}").bounding_box()
        assert label and box and abs(label["x"] - box["x"]) < 2, field
        assert 0 <= box["y"] - (label["y"] + label["height"]) < 8, field
    assert page.title() != "ran" and not any("pwned" in m for m in refused)
    context.close()


def test_a_form_on_another_site_cannot_change_the_store(
    viewer: tuple[str, dict[str, str]], browser: Any, env: dict[str, str], project: Path
) -> None:
    url, ids = viewer
    target = f"{url}record/{ids['port']}/forget"
    attack = (
        f'<form id="f" method="post" action="{target}"><input name="reason" value="x">'
        '</form><script>document.getElementById("f").submit()</script>'
    ).encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(attack)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page = browser.new_page()
        with page.expect_response(target) as answer:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        assert answer.value.status == 403
        time.sleep(0.2)
    finally:
        server.shutdown()
    found = cli(env, project, "search", "port 8080 nginx")
    assert ids["port"] in {hit["id"] for hit in found["results"]}
