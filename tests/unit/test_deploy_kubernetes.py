"""deploy/kubernetes: the team server's manifests are valid Kubernetes objects (Kubernetes'
own OpenAPI schemas through kubernetes-validate, strict: an unknown or misspelt field fails),
hold together (names that refer to each other exist), and grant the server no more than its
Kubernetes backend needs, in its own namespace only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard.pools import load_pools

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSIONS = ("1.35.0", "1.37.0")
"""Two current minor versions of Kubernetes (kubernetes-validate ships their schemas)."""

LEAST_RIGHTS = {
    ("", "pods"): {"create", "get", "list", "watch", "delete"},
    ("", "services"): {"create", "get", "list", "delete"},
    ("", "secrets"): {"create", "get", "list", "delete"},
    ("", "configmaps"): {"create", "get", "list", "delete"},
    ("", "pods/log"): {"get"},
    ("", "pods/exec"): {"create", "get"},
    ("", "pods/portforward"): {"create", "get"},
    ("", "events"): {"get", "list", "watch"},
    ("events.k8s.io", "events"): {"get", "list", "watch"},
    ("scheduling.run.ai", "podgroups"): {"create", "get", "list", "delete"},
    ("scheduling.volcano.sh", "podgroups"): {"create", "get", "list", "delete"},
    ("scheduling.x-k8s.io", "podgroups"): {"create", "get", "list", "delete"},
}
"""(API group, resource) -> verbs: pods per task attempt (watched), a headless Service per
group, credentials as Secrets, the per-workflow owner ConfigMap, logs, exec and port-forward,
events for the waiting reasons, and the gang schedulers' PodGroups. Nothing else."""


def _documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in _documents()
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {DEPLOY}"
    return found[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_passes_kubernetes_validate_strict(version: str) -> None:
    validate = pytest.importorskip("kubernetes_validate")
    docs = _documents()
    assert {d["kind"] for d in docs} >= {
        "Namespace",
        "Secret",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "ConfigMap",
        "PersistentVolumeClaim",
    }
    for doc in docs:
        validate.validate(doc, version, strict=True)  # raises ValidationError


def test_strict_validation_would_catch_a_misspelt_field() -> None:
    validate = pytest.importorskip("kubernetes_validate")
    service = _one("Service")
    broken = {**service, "spec": {**service["spec"], "selectr": {"a": "b"}}}
    with pytest.raises(validate.ValidationError):
        validate.validate(broken, VERSIONS[-1], strict=True)


def test_everything_lives_in_one_namespace_and_no_right_reaches_the_cluster() -> None:
    docs = _documents()
    namespace = _one("Namespace")["metadata"]["name"]
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_the_role_grants_exactly_the_backends_least_rights() -> None:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in _one("Role")["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == LEAST_RIGHTS


def test_the_server_runs_as_the_bound_account_on_the_secrets_database() -> None:
    deployment, binding = _one("Deployment"), _one("RoleBinding")
    pod = deployment["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    assert _one("ServiceAccount", account)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": binding["metadata"]["namespace"]}
    ]
    assert binding["roleRef"]["name"] == _one("Role")["metadata"]["name"]
    assert deployment["spec"]["replicas"] == 1  # one engine per store
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["TRAINYARD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] in _one("Secret", ref["name"])["stringData"]
    assert _one("Secret", ref["name"])["stringData"][ref["key"]].startswith("postgresql://")
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims == {_one("PersistentVolumeClaim")["metadata"]["name"]}
    home = next(m for m in container["volumeMounts"] if m["name"] == "home")["mountPath"]
    assert env["TRAINYARD_HOME"]["value"] == home
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"]["path"] == "/api/health"  # the one route without a token


def test_the_pool_reaches_the_server_through_its_service(tmp_path: Path) -> None:
    text = _one("ConfigMap", "trainyard-pools")["data"]["pools.yaml"]
    (tmp_path / "pools.yaml").write_text(text)
    pool = load_pools(tmp_path / "pools.yaml")["k8s"]  # every pool, served here or not
    assert pool.backend == "kubernetes"
    service = _one("Service")
    meta = service["metadata"]
    port = service["spec"]["ports"][0]["port"]
    assert pool.options["server_url"] == f"http://{meta['name']}.{meta['namespace']}.svc:{port}"
    assert pool.options["namespace"] == meta["namespace"]
    selector = service["spec"]["selector"]
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
