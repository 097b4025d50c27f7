"""The viewer's page times from a real browser, on a store you name (not a test).

    uv run python tests/viewer/page_times.py DATA_DIR PROJECT_DIR

starts ``memory-mcp ui`` on the store in ``DATA_DIR`` (its ``memory.db``; e.g. a
``bench perf --keep`` folder) for the project in ``PROJECT_DIR``, loads each main
page five times in headless Chromium (Debian's ``chromium``, or ``$CHROMIUM_PATH``)
and prints a Markdown table of the medians: first byte (Navigation Timing's
``responseStart - requestStart``) and full load (``loadEventEnd``). The hundredth
page of the project's memories is reached by following "Older" 99 times.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import time

from playwright.sync_api import Page, sync_playwright

SETTLE_S = 20
TIMING = (
    "(() => { const n = performance.getEntriesByType('navigation')[0];"
    " return [n.responseStart - n.requestStart, n.loadEventEnd - n.startTime]; })()"
)


def older(page: Page, url: str) -> str:
    found = re.search(r'href="([^"]+)" rel="next"', page.content())
    assert found, "no older page"
    return url.rstrip("/") + found.group(1).replace("&amp;", "&")


def main(data: str, project: str) -> None:
    chromium = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium")
    if not chromium:
        sys.exit("no Chromium: apt-get install chromium, or set CHROMIUM_PATH")
    env = {**os.environ, "MEMORY_MCP_DATA_DIR": data}
    command = [shutil.which("memory-mcp") or "memory-mcp", "ui", "--port", "0"]
    server = subprocess.Popen(command, cwd=project, env=env, stderr=subprocess.PIPE)
    assert server.stderr is not None
    line = server.stderr.readline().decode()
    found = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
    if not found:
        sys.exit(f"the viewer did not start: {line}")
    url = found.group(1)
    time.sleep(8)  # the model loads in the background; searches want it
    try:
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(url)
            key = re.search(r'href="/project\?key=([^"&]+)"', page.content())
            assert key, "no project on the projects page"
            listing = f"{url}project?key={key.group(1)}"
            page.goto(listing)
            record = re.search(r'href="/record/([^"]+)"', page.content())
            assert record, "no record on the project's page"
            # The first search loads the project's vectors and clusters them in the
            # background (12 s at 200,000 memories); until then searches score every row.
            page.goto(f"{listing}&q=warm+up")
            time.sleep(SETTLE_S)
            page.goto(listing)
            for _ in range(99):
                page.goto(older(page, url))
            hundredth = page.url
            pages = {
                "projects": url,
                "a project's memories, first page": listing,
                "the 100th page": hundredth,
                "one kind": f"{listing}&kind=decision",
                "a search": f"{listing}&q=how+do+I+run+the+tests",
                "a search for one kind": f"{listing}&q=which+database&kind=decision",
                "a record": f"{url}record/{record.group(1)}",
                "conflicts": f"{url}conflicts",
                "archived": f"{url}archived",
                "brief": f"{url}brief?key={key.group(1)}",
                "maintenance": f"{url}maintenance",
            }
            print("| page | first byte p50 (ms) | full load p50 (ms) |\n|---|---|---|")
            for name, target in pages.items():
                first, full = [], []
                for _ in range(5):
                    page.goto(target)
                    byte, load = page.evaluate(TIMING)
                    first.append(byte)
                    full.append(load)
                byte, load = statistics.median(first), statistics.median(full)
                print(f"| {name} | {byte:.0f} | {load:.0f} |")
            browser.close()
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
