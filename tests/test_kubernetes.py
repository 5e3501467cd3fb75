"""deploy/kubernetes, checked without a cluster: every manifest against the Kubernetes
schemas (kubernetes-validate, strict, its bundled schemas: offline), checkov over them (no
failed check; each skip names its reason), the overlays rendered as `kubectl apply -k`
renders them, and the names the pods are given (Secret keys, ${VAR}s) the ones the image
and deploy/compose.yaml use, so the topology the compose tests run in containers is the
one the manifests describe.

deploy/kubernetes/monitoring (a PodMonitor, a PrometheusRule) is the Prometheus Operator's
API, which the Kubernetes schemas do not hold: kubernetes-validate leaves it out; tests hold
what the PodMonitor names to what the manifests and the gateway's configuration give (its
port, its pods, the Secret's key) and the PrometheusRule to deploy/prometheus/alerts.yaml;
checkov reads both with the rest.

kubernetes-validate and checkov pin many libraries of their own: scripts/test.sh installs
them in .test-envs/k8s; without it these tests are skipped, saying so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.settings.load import load
from gateway.settings.schema import Limits, Listen

ROOT = Path(__file__).parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
MONITORING = KUBE / "monitoring"  # the Prometheus Operator's objects (CRDs)
TOOLS = ROOT / ".test-envs" / "k8s" / "bin"
OVERLAYS = ("valkey-sentinel", "external-store")
# What the pods are given beside the Secret's keys.
POD_NAMES = {"GATEWAY_PORT", "POD_IP", "HOSTNAME", "HOME"}
# Checks the manifests do not meet, each with its reason in a checkov.io/skip annotation.
SKIPPED = {"CKV_K8S_35",  # secrets as environment variables: the gateway reads ${VAR}s
           "CKV_K8S_43"}  # image digests: the operator's registry gives them

needs_tools = pytest.mark.skipif(
    not (TOOLS / "checkov").exists() or not (TOOLS / "kubernetes-validate").exists(),
    reason=".test-envs/k8s (checkov, kubernetes-validate) is missing: scripts/test.sh "
           "installs it")
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None,
                                   reason="kubectl (its kustomize) is not installed")


def manifests() -> list[Path]:
    """Every file of Kubernetes objects (not kustomizations, not the gateway's configs, not
    the Prometheus Operator's)."""
    return sorted(p for p in KUBE.rglob("*.yaml")
                  if any("kind" in d for d in docs(p)) and p.name != "kustomization.yaml"
                  and MONITORING not in p.parents)


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def objects(kind: str) -> list[dict[str, Any]]:
    return [d for p in manifests() for d in docs(p) if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in objects(kind) if d["metadata"]["name"] == name]
    return found


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TOOLS / "kubernetes-validate"), "--strict", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


@needs_tools
def test_every_manifest_passes_the_kubernetes_schemas(tmp_path: Path) -> None:
    files = manifests()
    assert {p.name for p in files} == {"deployment.yaml", "namespace.yaml", "valkey.yaml",
                                       "ingress-nginx.yaml"}
    done = validate(*files)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = re.findall(r"passed for resource (\S+)", done.stdout)
    assert len(passed) == sum(len(docs(p)) for p in files), done.stdout
    # The schemas bite: a misspelt field is refused, offline.
    bad = tmp_path / "bad.yaml"
    bad.write_text((KUBE / "base" / "deployment.yaml").read_text().replace(
        "readinessProbe:", "readynessProbe:"))
    refused = validate(bad)
    assert refused.returncode != 0 and "readynessProbe" in refused.stdout + refused.stderr


@needs_tools
@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_whole_and_valid(overlay: str, tmp_path: Path) -> None:
    """As `kubectl apply -k deploy/kubernetes/OVERLAY` renders it: the gateway's generated
    configuration is the one its pods mount, and every object passes the schemas."""
    rendered = subprocess.run(["kubectl", "kustomize", str(KUBE / overlay)],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    out = tmp_path / f"{overlay}.yaml"
    out.write_text(rendered)
    done = validate(out)
    assert done.returncode == 0, done.stdout + done.stderr
    items = [d for d in yaml.safe_load_all(rendered) if d]
    (config,) = [d for d in items if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"].startswith("mcp-task-gateway-config")]
    assert config["data"]["gateway.yaml"] == (KUBE / overlay / "gateway.yaml").read_text()
    (deployment,) = [d for d in items if d["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config["metadata"]["name"]
    kinds = {d["kind"] for d in items}
    assert {"Namespace", "Deployment", "Service", "PodDisruptionBudget",
            "NetworkPolicy"} <= kinds
    assert ("StatefulSet" in kinds) == (overlay == "valkey-sentinel")
    assert {d["metadata"].get("namespace", "mcp-task-gateway") for d in items} == {
        "mcp-task-gateway"}


@needs_tools
def test_checkov_finds_nothing_but_the_skips_it_is_told_why() -> None:
    frameworks = ["kubernetes", *(["kustomize"] if shutil.which("kubectl") else [])]
    done = subprocess.run([str(TOOLS / "checkov"), "--directory", str(KUBE), "--framework",
                           *frameworks, "--skip-download", "--output", "json"],
                          capture_output=True, text=True, timeout=300)
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert {r["check_type"] for r in reports} == set(frameworks), done.stderr[-2000:]
    for report in reports:
        failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
        assert failed == [], failed
        assert report["summary"]["passed"] > 100 and report["summary"]["parsing_errors"] == 0
        skipped = {c["check_id"] for c in report["results"]["skipped_checks"]}
        assert skipped == SKIPPED, skipped
    assert done.returncode == 0
    # Each skip is an annotation that says why.
    for kind in ("Deployment", "StatefulSet"):
        for obj in objects(kind):
            notes = [v for k, v in obj["metadata"]["annotations"].items()
                     if k.startswith("checkov.io/skip")]
            assert {n.split("=", 1)[0] for n in notes} == SKIPPED
            assert all(len(n.split("=", 1)[1]) > 20 for n in notes), notes


def test_the_ingress_example_outlasts_keepalives_and_takes_what_the_gateway_takes() -> None:
    """Its timeouts match the gateway's (docs/long-calls.md): a quiet stream hears a
    keep-alive comment every sse_keepalive_ms, well within the ingress's read timeout;
    its body bound is the gateway's; it routes to the Service's named port."""
    ingress = named("Ingress", "mcp-task-gateway")
    notes = ingress["metadata"]["annotations"]
    keepalive_s = Listen().sse_keepalive_ms / 1000
    for timeout in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(notes[f"nginx.ingress.kubernetes.io/{timeout}"]) >= 4 * keepalive_s
    assert notes["nginx.ingress.kubernetes.io/proxy-body-size"] == \
        f"{Limits().max_body_bytes >> 20}m"
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # SSE as it comes
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    service = named("Service", "mcp-task-gateway")
    assert path["backend"]["service"] == {
        "name": service["metadata"]["name"], "port": {"name": service["spec"]["ports"][0][
            "name"]}}


def test_the_gateway_runs_three_replicas_probed_unprivileged_and_bounded() -> None:
    deployment = named("Deployment", "mcp-task-gateway")
    pod = deployment["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 3
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["envFrom"] == [{"secretRef": {"name": "mcp-task-gateway"}}]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] \
        == int(re.search(r"^USER (\d+)", (ROOT / "Dockerfile").read_text(), re.M)[1])
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    assert set(gateway["resources"]) == {"requests", "limits"}
    budget = named("PodDisruptionBudget", "mcp-task-gateway")
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    service = named("Service", "mcp-task-gateway")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_only_the_gateway_and_the_store_itself_reach_the_store() -> None:
    store = named("StatefulSet", "valkey")["spec"]["template"]["metadata"]["labels"]
    gateway = named("Deployment", "mcp-task-gateway")["spec"]["template"]["metadata"]["labels"]
    policy = named("NetworkPolicy", "valkey")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= store.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    sources = [s["podSelector"]["matchLabels"] for s in rule["from"]]
    assert all(set(s) == {"app.kubernetes.io/name"} for s in sources)  # no other key
    assert sorted(s["app.kubernetes.io/name"] for s in sources) == sorted(
        [gateway["app.kubernetes.io/name"], store["app.kubernetes.io/name"]])
    assert {p["port"] for p in rule["ports"]} == {6379, 26379}


def config_vars(path: Path) -> set[str]:
    """The ${VAR}s a gateway configuration reads (its comments left out)."""
    return set(re.findall(r"\$\{(\w+)", json.dumps(yaml.safe_load(path.read_text()))))


def compose_gateway_env(name: str) -> set[str]:
    compose = yaml.safe_load((ROOT / "deploy" / name).read_text())
    return set(compose["x-gateway"]["environment"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pods_names_are_the_image_and_compose_ones(overlay: str, monkeypatch) -> None:
    """Every ${VAR} of an overlay's configuration is a name deploy/compose.yaml gives its
    replicas (or its store password), or one the pod sets; with them set, it loads as a
    replica set: a shared store, the replica's id and address from the pod."""
    path = KUBE / overlay / "gateway.yaml"
    wanted = config_vars(path)
    compose = compose_gateway_env("compose.yaml") | {"STORE_PASSWORD"}
    assert wanted - POD_NAMES <= compose, wanted - POD_NAMES - compose
    assert wanted >= {"GATEWAY_TOKEN", "GATEWAY_SECRET", "GATEWAY_ADMIN_TOKEN"}
    values = {"GATEWAY_TOKEN": "t" * 32, "GATEWAY_SECRET": "s" * 64, "POD_IP": "10.1.2.3",
              "GATEWAY_ADMIN_TOKEN": "a" * 32, "STORE_PASSWORD": "p" * 24,
              "REDIS_URL": "redis://gateway:pw@store.example:6379/0", "HOSTNAME": "gw-7f9-x"}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    conf = load(path)
    assert conf.store.backend == "redis" and conf.listen.host == "0.0.0.0"
    assert (conf.replica.id, conf.replica_url) == ("gw-7f9-x", "http://10.1.2.3:8080")
    deployment = named("Deployment", "mcp-task-gateway")
    env = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env <= POD_NAMES
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["port"] == "http" and conf.listen.port == 8080


def test_the_readme_makes_the_secrets_the_manifests_read() -> None:
    """docs/replicas.md's `kubectl create secret` lines (once README's) give each key the
    valkey-sentinel pods read, no other; for external-store, REDIS_URL in place of
    STORE_PASSWORD."""
    readme = (ROOT / "docs" / "replicas.md").read_text().split("## On Kubernetes", 1)[1]
    readme = readme.split("\n## ", 1)[0]
    made = {(name, key) for name, keys in re.findall(
                r"create secret generic (\S+)((?:.*\\\n)*.*)", readme)
            for key in re.findall(r"--from-literal=(\w+)=", keys)}
    store = named("StatefulSet", "valkey")["spec"]["template"]["spec"]["containers"]
    read = {(r["name"], r["key"]) for r in (e["valueFrom"]["secretKeyRef"]
                                            for c in store for e in c["env"])}
    sentinel = config_vars(KUBE / "valkey-sentinel" / "gateway.yaml") - POD_NAMES
    assert {("mcp-task-gateway", k) for k in sentinel} | read == made
    assert "takes `--from-literal=REDIS_URL=rediss://...` in\nplace of `STORE_PASSWORD`" in readme
    external = config_vars(KUBE / "external-store" / "gateway.yaml") - POD_NAMES
    assert external == sentinel - {"STORE_PASSWORD"} | {"REDIS_URL"}


def test_the_store_start_scripts_are_shell() -> None:
    scripts = named("ConfigMap", "valkey-scripts")["data"]
    for name, text in scripts.items():
        done = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr)
    assert "${STORE_PASSWORD}" in scripts["valkey.sh"]  # the gateway user's, as compose's
    # The gateway's store user has the rights deploy/compose.yaml gives it (and tests).
    command = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"][
        "valkey"]["command"]
    at = command.index("gateway")
    assert command[at + 1:at + 3] == ["on", ">${STORE_PASSWORD}"]
    rights = " ".join(command[at + 3:command.index("--appendonly")])
    assert f"user gateway on >${{STORE_PASSWORD}} {rights}\n" in scripts["valkey.sh"]


def monitoring(kind: str) -> list[dict[str, Any]]:
    """The objects of deploy/kubernetes/monitoring of `kind`: the Prometheus Operator's."""
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    made = [d for r in kustomization["resources"] for d in docs(MONITORING / r)]
    assert {d["apiVersion"] for d in made} == {"monitoring.coreos.com/v1"}
    assert {d["metadata"]["namespace"] for d in made} == {"mcp-task-gateway"}
    return [d for d in made if d["kind"] == kind]


def test_the_prometheus_rule_is_the_alert_rules_file() -> None:
    """The PrometheusRule holds deploy/prometheus/alerts.yaml's groups as they are, which
    promtool checks and tests (tests/e2e/test_dashboards.py)."""
    (rule,) = monitoring("PrometheusRule")
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())
    assert rule["spec"] == {"groups": rules["groups"]}


def test_the_pod_monitor_scrapes_each_replicas_operator_listener() -> None:
    """deploy/kubernetes/monitoring: a PodMonitor of the gateway's pods, on the container port
    the gateway's operator listener (listen.operator_port) is bound to in each overlay,
    at /metrics, with the operators' token (the Secret's key the pods read), through the
    NetworkPolicy; its objects are the Prometheus Operator's only."""
    (monitor,) = monitoring("PodMonitor")
    deployment = named("Deployment", "mcp-task-gateway")
    pod = deployment["spec"]["template"]
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert endpoint["path"] == "/metrics" and endpoint["port"] in ports
    for overlay in OVERLAYS:
        listen = yaml.safe_load((KUBE / overlay / "gateway.yaml").read_text())["listen"]
        assert (listen["operator_port"], listen["operator_host"]) == (
            ports[endpoint["port"]], "0.0.0.0")  # the pod's address, for Prometheus
        assert "GATEWAY_ADMIN_TOKEN" in config_vars(KUBE / overlay / "gateway.yaml")
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {
        "name": deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"][0][
            "secretRef"]["name"], "key": "GATEWAY_ADMIN_TOKEN"}}
    policy = named("NetworkPolicy", "mcp-task-gateway")["spec"]
    admitted = {p["port"] for rule in policy["ingress"] for p in rule["ports"]}
    assert ports[endpoint["port"]] in admitted
    service = named("Service", "mcp-task-gateway")  # which exposes the MCP port only
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
