"""/status in a real headless browser (Debian's Chromium, installed by scripts/test.sh): the
page renders, shows the upstream, a running task and a recent failure, and escapes what
upstream servers wrote; with calls flowing, its tools table and charts fill, script-free,
each chart with its text. Screenshots of the page at rest and under load go to a temporary
folder, or to SCREENSHOTS (a folder: docs/images to renew the docs' own)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from conftest import settings_for, wait_until_ready
from test_tasks import POLICY, call, wait_for

from gateway.app import create_app
from gateway.settings.load import from_mapping

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The machine's network is closed: without these Chromium tries Google's hosts at start.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")

async def rendered_dom(url: str) -> str:
    """The DOM after Chromium loaded and laid out `url`."""
    if CHROMIUM is None:
        pytest.fail("Chromium is missing: run scripts/test.sh (it installs Debian's chromium)")
    with tempfile.TemporaryDirectory() as profile:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    return out.decode()


async def screenshot(url: str, path: Path) -> None:
    """`url` as Chromium shows it in a window 1280 pixels wide, saved as a PNG at `path`."""
    with tempfile.TemporaryDirectory() as profile:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM or "chromium", *FLAGS, f"--user-data-dir={profile}", "--hide-scrollbars",
            "--window-size=1280,1500", f"--screenshot={path}", url,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        await asyncio.wait_for(proc.wait(), 60)
    assert proc.returncode == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size < 300_000  # small enough to keep in the repository


async def test_status_page_shows_a_running_task_in_a_browser(gateway, http) -> None:
    url = await gateway(tasks=POLICY, replica={"id": "replica-<one>"})
    failed = (await call(http, url, "blob", {"bytes": "not a number"})).body["result"]
    await wait_for(http, url, failed["taskId"], "failed")
    running = (await call(http, url, "sleep", {"ms": 20_000})).body["result"]
    assert running["resultType"] == "task"
    dom = await rendered_dom(url.replace("/mcp", "/status"))
    assert "<title>MCP task gateway: status</title>" in dom
    assert 'id="replica">replica-&lt;one&gt;</b>' in dom  # escaped, not markup
    assert "memory, up" in dom
    upstreams = dom.split('id="upstreams"')[1].split("</table>")[0]
    assert "<td>main</td>" in upstreams and ">ready</span>" in upstreams
    assert "<td>stdio</td>" in upstreams
    tasks = dom.split('id="tasks"')[1].split("</table>")[0]
    assert running["taskId"] in tasks and "<td>sleep</td><td>working</td>" in tasks
    live = dom.split('id="live"')[1].split("</table>")[0]
    assert "<td>main</td><td>sleep</td><td>working</td><td>1</td>" in live
    failures = dom.split('id="failures"')[1].split("</table>")[0]
    assert "<td>blob</td>" in failures
    assert "<script" not in dom


async def test_a_failures_row_says_why_without_the_servers_words(gateway, http) -> None:
    """A failed task's row has a message: the gateway's words, never the server's, which
    may quote an argument value ("not a number" here: the blob tool's int() error)."""
    url = await gateway(tasks=POLICY)
    failed = (await call(http, url, "blob", {"bytes": "not a number"})).body["result"]
    await wait_for(http, url, failed["taskId"], "failed")
    timed = (await call(http, url, "hang", {})).body["result"]  # timeout_ms: 300
    await wait_for(http, url, timed["taskId"], "failed")
    async with http.get(url.replace("/mcp", "/status")) as page:
        failures = (await page.text()).split("id=failures")[1].split("</table>")[0]
    assert "<td>blob</td><td>the server answered JSON-RPC error -32603</td>" in failures
    assert "<td>hang</td><td>timed out after 300 ms</td>" in failures
    assert "not a number" not in failures


SAMPLE_S = 0.2  # the charts cover 90 samples: 18 s here
LOAD = {"tools": {**POLICY["tools"], "sleep": {"mode": "auto"}}}  # 200 ms, then a task


@pytest.mark.slow
async def test_the_last_quarter_of_an_hour_in_a_table_and_charts(aiohttp_server, http,
                                                                 tmp_path) -> None:
    """With inline calls, task calls, failures and a queue flowing, the tools table counts
    each tool and the charts draw them; no script, and each chart says in text what it
    shows (its role, its label, its caption)."""
    shots = Path(os.environ.get("SCREENSHOTS") or tmp_path)
    conf = settings_for(tasks={**POLICY, **LOAD}, replica={"id": "screenshot"},
                        upstream={"max_concurrency": 6, "max_queue": 100})
    server = await aiohttp_server(create_app(from_mapping(conf), sample_s=SAMPLE_S))
    base = str(server.make_url(""))
    await wait_until_ready(base)
    url, page = base + "/mcp", base + "/status"
    await asyncio.sleep(3 * SAMPLE_S)
    await screenshot(page, shots / "status-at-rest.png")

    async def client(i: int, until: float) -> None:
        while time.monotonic() < until:
            await call(http, url, "echo", {"text": "hi"})  # inline (mode: never)
            await call(http, url, "sleep", {"ms": 20 + 50 * (i % 4)})  # inline, within budget
            if i % 3 == 0:
                await call(http, url, "sleep", {"ms": 600})  # a task
            if i % 4 == 0:
                await call(http, url, "blob", {"bytes": "not a number"})  # a failed task

    until = time.monotonic() + 8
    load = [asyncio.create_task(client(i, until)) for i in range(12)]
    await asyncio.sleep(6)
    await screenshot(page, shots / "status-under-load.png")
    dom = await rendered_dom(page)
    await asyncio.gather(*load)

    assert "<script" not in dom
    tools = dom.split('id="tools"')[1].split("</table>")[0]
    rows = {cells[1]: cells for cells in (re.findall(r"<td[^>]*>([^<]*)</td>", row)
                                          for row in tools.split("<tr>")[2:])}
    assert set(rows) >= {"echo", "sleep", "blob"}
    assert float(rows["echo"][2]) > 10  # calls a minute
    assert rows["echo"][3] == "0 %" and rows["blob"][3] == "100 %"  # errors
    assert rows["sleep"][5].endswith(("ms", " s"))  # p99
    charts = re.findall(r"<svg[^>]*>", dom)
    assert len(charts) == 4  # one upstream: calls, p99, live tasks, queued
    for svg in charts:
        assert 'role="img"' in svg and re.search(r'aria-label="[^"]{20,}"', svg)
    captions = re.findall(r"<figcaption>([^<]+)</figcaption>", dom)
    assert len(captions) == 4 and "calls a second: " in captions[0]
    assert not captions[0].endswith("none in the last 18 s")  # the calls are drawn
