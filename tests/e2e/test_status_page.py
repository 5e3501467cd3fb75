"""/status in a real headless browser (Debian's Chromium, installed by scripts/test.sh): the
page renders, shows the upstream, a running task and a recent failure, and escapes what
upstream servers wrote."""

from __future__ import annotations

import asyncio
import shutil
import tempfile

import pytest
from test_tasks import POLICY, call, wait_for

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
