"""The user's pages hold together and follow the code (issue 42, "Documentation as a newcomer
meets it"): every relative link of README.md, SECURITY.md and docs/ lands on a file of the
repository and, where it names one, on a heading of that file; README stays a landing page;
docs/limits.md has every `limits:` key with the code's default; docs/operations.md names every
log event, metric series and rejection reason the gateway writes; config/gateway.yaml, which
says its values are the defaults, shows the defaults. Read without a gateway: seconds."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from gateway import errors
from gateway.settings import schema as settings

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").rglob("*.md")),
         ROOT / "bench" / "README.md"]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced code blocks or inline code (a link shown there is not one)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces
    as hyphens; a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_every_link_lands_on_a_file_and_a_heading() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z]+:", target):  # https://..., mailto:
                continue
            path, _, anchor = target.partition("#")
            landing = (page.parent / path).resolve() if path else page
            if not landing.is_relative_to(ROOT) or not landing.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and landing.suffix == ".md" and anchor not in anchors(landing):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_is_a_landing_page_that_names_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, page.name
    assert "`.venv/bin/pytest tests/unit`" in readme and "    ./scripts/test.sh\n" in readme


def human(name: str, value: Any) -> str:
    """A default as docs/limits.md writes it: sizes in KiB or MiB, durations in s, min or h,
    counts with thousands separators."""
    if name.endswith("_bytes") or "_bytes_" in name:
        return f"{value >> 20} MiB" if value % (1 << 20) == 0 else f"{value >> 10} KiB"
    if name.endswith("_ms"):
        for unit, ms in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
            if value % ms == 0:
                return f"{value // ms} {unit}"
        return f"{value} ms"
    return f"{int(value):,}"


def test_every_limit_is_on_the_limits_page_with_its_default() -> None:
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")]
            for line in (ROOT / "docs" / "limits.md").read_text().splitlines()
            if line.startswith("| `")]
    for field in dataclasses.fields(settings.Limits):
        row = next((r for r in rows if f"`{field.name}`" in r[0]), None)
        assert row is not None, f"docs/limits.md has no row for limits.{field.name}"
        assert human(field.name, field.default) in row[1], (field.name, row[1])


def gateway_sources() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "gateway").rglob("*.py")))


def test_every_log_event_metric_and_rejection_is_on_the_operations_page() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    code = gateway_sources()
    events = set(re.findall(r"\.(?:debug|info|warning|error|exception|critical)\(\s*"
                            r"[\"']([a-z_]+\.[a-z_]+)[\"']", code))
    events |= set(re.findall(r"\baudit\(\s*[\"']([a-z_]+\.[a-z_]+)[\"']", code))
    events |= {f"task.{s}" for s in ("completed", "failed", "cancelled")}  # audit(f"task.{...}")
    assert {"upstream.eras", "session.adopted", "shutdown.tasks_ended"} <= events  # found
    series = set(re.findall(r"\"(mcp_gateway_[a-z_]+)\"", code))
    assert series
    missing = [e for e in sorted(events) if f"`{e}`" not in page]
    missing += [s for s in sorted(series) if not re.search(rf"`{s}(_total)?[{{`]", page)]
    missing += [f"reason {r}" for r in typing.get_args(errors.Rejection) if f"`{r}`" not in page]
    missing += [f"cause {c}" for c in typing.get_args(errors.AuthCause) if f"`{c}`" not in page]
    assert not missing, missing


def commented_defaults(text: str) -> dict[str, Any]:
    """`# key: value  # the default ...` lines: a default shown without being set."""
    return {k: yaml.safe_load(v) for k, v in
            re.findall(r"^\s*# (\w+): (\S+)\s+# the default", text, re.M)}


def test_the_default_configuration_shows_the_defaults() -> None:
    """config/gateway.yaml says "the values below are the defaults": each is the code's,
    the commented request_timeout_ms included (once documented three ways, issue 42); and
    the pages that state that default state the code's."""
    text = (ROOT / "config" / "gateway.yaml").read_text()
    conf = yaml.safe_load(text)
    sections = {"listen": settings.Listen(), "limits": settings.Limits(),
                "logging": settings.Logging()}
    for name, default in sections.items():
        for key, value in conf[name].items():
            assert getattr(default, key) == value, (name, key)
    assert conf["tasks"]["defaults"] == {
        k: getattr(settings.TaskPolicy(), k) for k in conf["tasks"]["defaults"]}
    assert conf["security"]["allowed_origins"] == settings.Security().allowed_origins
    (upstream,) = conf["upstreams"].values()
    fields = {f.name: f for f in dataclasses.fields(settings.Upstream)}
    shown = {**upstream, **commented_defaults(text)}
    assert "request_timeout_ms" in shown
    for key, value in shown.items():
        if key not in ("command", "args"):
            assert fields[key].default == value, key
    timeout = fields["request_timeout_ms"].default
    assert isinstance(timeout, int)
    for page in ("upstreams.md", "long-calls.md"):
        assert f"default {timeout}, ten minutes" in " ".join(
            (ROOT / "docs" / page).read_text().split()), page
    assert f"`{timeout}`" in (ROOT / "docs" / "configuration.md").read_text()


def test_every_test_file_is_in_the_feature_table() -> None:
    """docs/development.md says which tests hold which feature (issue 51: 17 files were
    missing): a new test file is named there, in its feature's row."""
    doc = (ROOT / "docs" / "development.md").read_text()
    table = doc[doc.index("## Which tests hold which feature"):doc.index("## Benchmarks")]
    named = set(re.findall(r"(test_\w+\.py)", table))
    files = {p.name for p in (ROOT / "tests").rglob("test_*.py") if "node_modules" not in p.parts}
    assert sorted(files - named) == []
