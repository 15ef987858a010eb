"""The Kubernetes manifests in ``deploy/k8s``, checked without a cluster: every document against
the Kubernetes API's schemas (``kubernetes-validate``, offline, strict: unknown fields fail), the
node's command line as a pod runs it through murmur's own parser and settings schema, and the
certificate Job's script run as the Job runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from node.cli.commands.run import build_node_config
from node.cli.main import make_parser
from node.config import NodeConfig
from node.security.pki import CA_CERT_FILE, CERT_FILE, KEY_FILE
from node.telemetry.metrics import SCRAPE_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
#: The Kubernetes version the manifests are checked against (k3s and the clouds all run it).
KUBERNETES_VERSION = "1.32.0"
NAMESPACE = "swarm"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def applied() -> dict[tuple[str, str], dict[str, Any]]:
    """What ``kubectl apply -f deploy/k8s/`` creates (not gpu/: a folder below is not applied)."""
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in documents(path):
            out[doc["kind"], doc["metadata"]["name"]] = doc
    return out


def merge(base: Any, patch: Any) -> Any:
    """A strategic merge patch as kubectl applies it to these fields: maps merge, lists of
    named objects (containers, env) merge by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    named = isinstance(base, list) and all(isinstance(x, dict) and "name" in x for x in base)
    if named and isinstance(patch, list):
        by_name = {x["name"]: x for x in base}
        for item in patch:
            by_name[item["name"]] = merge(by_name.get(item["name"], {}), item)
        return list(by_name.values())
    return patch


def gpu_statefulset() -> dict[str, Any]:
    [patch] = documents(K8S / "gpu" / "statefulset-gpu.yaml")
    return merge(applied()["StatefulSet", "murmur"], patch)  # type: ignore[no-any-return]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in a container's env values and args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def container_env(container: dict[str, Any], pod: str) -> dict[str, str]:
    fields = {"metadata.name": pod, "metadata.namespace": NAMESPACE}
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = expand(var["value"], env)
    return env


def run_argv(statefulset: dict[str, Any], ordinal: int, tmp_path: Path) -> list[str]:
    """The argv that pod ``ordinal``'s start script hands ``murmur`` (a stand-in on PATH that
    records it), from the ConfigMap's script and the StatefulSet's args as Kubernetes expands
    them."""
    pod = f"murmur-{ordinal}"
    [container] = statefulset["spec"]["template"]["spec"]["containers"]
    env = container_env(container, pod)
    script = tmp_path / "start"
    script.write_text(applied()["ConfigMap", "murmur-start"]["data"]["start"])
    assert container["command"] == ["sh", "/etc/murmur/start"]
    record = tmp_path / "argv.json"
    fake = tmp_path / "bin" / "murmur"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    fake.chmod(0o755)
    args = [expand(a, env) for a in container["args"]]
    path = f"{fake.parent}:/usr/bin:/bin"
    subprocess.run(["sh", str(script), *args], env={**env, "PATH": path}, check=True, timeout=30)
    return list(json.loads(record.read_text()))


def node_config(argv: list[str]) -> NodeConfig:
    assert argv[0] == "run"
    return build_node_config(make_parser().parse_args(argv), environ={})


def test_every_manifest_passes_the_kubernetes_schemas() -> None:
    docs = [d for p in sorted(K8S.glob("*.yaml")) for d in documents(p)]
    kinds = {d["kind"] for d in docs}
    assert kinds >= {
        "StatefulSet",
        "Service",
        "Job",
        "ConfigMap",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceAccount",
        "Role",
        "RoleBinding",
    }
    for doc in [*docs, gpu_statefulset()]:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_catches_a_wrong_field() -> None:
    """The check above can fail: a misspelt field is refused."""
    statefulset = applied()["StatefulSet", "murmur"]
    bad = merge(statefulset, {"spec": {"replica": 3}})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_each_pod_runs_a_node_with_the_flags_it_needs(tmp_path: Path) -> None:
    statefulset = applied()["StatefulSet", "murmur"]
    replicas = statefulset["spec"]["replicas"]
    seed = f"murmur-0.murmur.{NAMESPACE}.svc.cluster.local:7070"
    for ordinal in range(replicas):
        cfg = node_config(run_argv(statefulset, ordinal, tmp_path))
        assert cfg.listen == "0.0.0.0:7070"
        assert cfg.advertise == f"murmur-{ordinal}.murmur.{NAMESPACE}.svc.cluster.local:7070"
        assert cfg.state_dir == Path("/state")
        assert cfg.tls_dir == Path("/state/tls")
        assert not cfg.insecure
        assert cfg.join == (() if ordinal == 0 else (seed,))  # pod 0 starts the swarm
        assert (cfg.shard_index, cfg.shard_count) == (ordinal, replicas)
        assert cfg.wait_members == replicas
        assert cfg.metrics_port == 9100
        assert cfg.metrics_host == "0.0.0.0"  # the probes and the scrapes come from outside
        assert cfg.device == "cpu"
    assert node_config(run_argv(gpu_statefulset(), 1, tmp_path)).device == "cuda"


def test_the_pods_ports_probes_and_volumes_fit_together() -> None:
    objects = applied()
    statefulset = objects["StatefulSet", "murmur"]
    service = objects["Service", "murmur"]
    pod = statefulset["spec"]["template"]
    [container] = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 7070, "metrics": 9100}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    # A stable name for every pod, resolvable before it is ready (else none could join pod 0).
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    # The state dir is on the pod's own claim; the CA key is in a Secret no node pod mounts.
    [claim] = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/state"
    secrets = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert secrets == {"murmur-nodes"}
    assert "nodes" not in mounts  # only the init container reads every node's files
    assert container["resources"]["limits"]
    assert container["resources"]["requests"]
    # Room for the final checkpoint after SIGTERM.
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 30
    # The NetworkPolicy opens exactly the two ports.
    policy = objects["NetworkPolicy", "murmur"]
    opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert opened == {ports["grpc"], ports["metrics"]}


#: The ServiceMonitor fields these manifests use (monitoring.coreos.com/v1; the offline
#: validator has no schema for custom resources, so the test holds to this list).
MONITOR_SPEC_FIELDS = {"selector", "endpoints", "namespaceSelector", "jobLabel"}
MONITOR_ENDPOINT_FIELDS = {"port", "path", "scheme", "interval", "scrapeTimeout"}


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, f"not a duration Prometheus takes here: {duration!r}"
    return int(match[1]) * (60 if match[2] == "m" else 1)


def test_the_service_monitor_scrapes_each_nodes_metrics_port_as_the_pods_serve_it() -> None:
    [monitor] = documents(K8S / "monitoring" / "servicemonitor.yaml")
    objects = applied()
    service = objects["Service", "murmur"]
    pod = objects["StatefulSet", "murmur"]["spec"]["template"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    # Its metadata is an ObjectMeta like any object's: check it with the schemas' own.
    meta_only = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": monitor["metadata"]}
    kubernetes_validate.validate(meta_only, KUBERNETES_VERSION, strict=True)
    spec = monitor["spec"]
    assert set(spec) <= MONITOR_SPEC_FIELDS
    # It selects the headless Service, and no other Service these manifests make.
    wanted = spec["selector"]["matchLabels"].items()
    services = [o for (kind, _), o in objects.items() if kind == "Service"]
    assert [s for s in services if wanted <= s["metadata"]["labels"].items()] == [service]
    port_names = {p["name"] for p in service["spec"]["ports"]}
    annotations = pod["metadata"]["annotations"]
    [endpoint] = spec["endpoints"]
    assert set(endpoint) <= MONITOR_ENDPOINT_FIELDS
    assert endpoint["port"] in port_names
    assert endpoint["port"] == "metrics"
    assert endpoint["path"] == annotations["prometheus.io/path"] == "/metrics"
    # The pods serve plain HTTP (no --metrics-tls); a scrape may wait SCRAPE_TIMEOUT_S for
    # the node's status.
    [container] = pod["spec"]["containers"]
    assert "--metrics-tls" not in container["args"]
    assert endpoint["scheme"] == "http"
    assert SCRAPE_TIMEOUT_S < seconds(endpoint["scrapeTimeout"]) <= seconds(endpoint["interval"])


def test_the_readmes_kubectl_commands_apply_the_folders_checked_here() -> None:
    """No cluster here to run them on: each ``kubectl apply`` the README shows names a folder
    of manifests that the tests above check, in the namespace they are checked for."""
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"`(kubectl apply [^`]*)`", readme)
    assert "kubectl apply -n swarm -f deploy/k8s/" in commands
    assert "kubectl apply -n swarm -f deploy/k8s/monitoring/" in commands
    for command in commands:
        words = command.split()
        folder = ROOT / words[words.index("-f") + 1]
        assert folder.is_dir(), command
        assert sorted(folder.glob("*.yaml")), command
        if "-n" in words:
            assert words[words.index("-n") + 1] == NAMESPACE, command


def test_the_certificate_job_issues_every_node_and_keeps_keys_when_rerun(tmp_path: Path) -> None:
    job = applied()["Job", "murmur-certs"]
    [issue] = job["spec"]["template"]["spec"]["initContainers"]
    script = issue["args"][0]
    nodes = int(next(e["value"] for e in issue["env"] if e["name"] == "NODES"))
    for folder in ("/work", "/old-ca", "/old-nodes"):  # the Job's volumes, as folders here
        script = script.replace(folder + "/", f"{tmp_path}{folder}/")
    (tmp_path / "old-ca").mkdir()
    (tmp_path / "old-nodes").mkdir()
    env = {"NODES": str(nodes), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}

    def run() -> dict[str, bytes]:
        subprocess.run(["sh", "-c", script], env=env, check=True, timeout=120)
        return {p.name: p.read_bytes() for p in (tmp_path / "work" / "nodes").iterdir()}

    first = run()
    names = {f"murmur-{i}.{f}" for i in range(nodes) for f in (KEY_FILE, CERT_FILE, CA_CERT_FILE)}
    assert set(first) == names
    assert all(re.fullmatch(r"[-._a-zA-Z0-9]+", n) for n in first)  # valid Secret keys
    assert {p.name for p in (tmp_path / "work" / "ca").iterdir()} >= {"ca_key.pem", CA_CERT_FILE}
    # The Job again, with the Secrets it wrote mounted: same CA, same keys, certificates anew.
    for p in (tmp_path / "work" / "ca").iterdir():
        (tmp_path / "old-ca" / p.name).write_bytes(p.read_bytes())
    for name, data in first.items():
        (tmp_path / "old-nodes" / name).write_bytes(data)
    subprocess.run(["rm", "-rf", str(tmp_path / "work")], check=True)
    second = run()
    for i in range(nodes):
        assert second[f"murmur-{i}.{KEY_FILE}"] == first[f"murmur-{i}.{KEY_FILE}"]
        assert second[f"murmur-{i}.{CA_CERT_FILE}"] == first[f"murmur-{i}.{CA_CERT_FILE}"]
