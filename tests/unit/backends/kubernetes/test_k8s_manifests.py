"""The manifests of a gang start: golden files, Kubernetes' own schemas (strict, several
versions), and each rule of the mapping (names, DNS, resources, placement, gang, security)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from k8s_support import HOME, GiB, check_golden, launches, pool, validate_strict

from trainyard.backends.base import TaskResources
from trainyard.backends.kubernetes import build_request, parse_options
from trainyard.backends.kubernetes.manifests import KubernetesRequest, with_owner
from trainyard.errors import BackendError, ConfigError
from trainyard.runfile import TaskRun

SEED = TaskResources(cpu=4, gpu=2, memory_bytes=8 * GiB, storage_bytes=10 * GiB)
PLATFORM = {
    "dgx-h100": {
        "node_selector": {"nvidia.com/gpu.product": "H100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
}


def _request(
    options: dict[str, Any] | None = None,
    tasks: dict[str, TaskResources] | None = None,
    pool_fields: dict[str, Any] | None = None,
    **launch_fields: Any,
) -> KubernetesRequest:
    the_pool = pool(options, **(pool_fields or {}))
    return build_request(
        launches(tasks or {"master": SEED, "worker": SEED}, **launch_fields),
        the_pool,
        parse_options("k8s", dict(the_pool.options)),
        HOME,
    )


def _pod(request: KubernetesRequest, index: int = 0) -> dict[str, Any]:
    return request.pods[index]


def test_seed_two_node_gang_golden_and_valid() -> None:
    request = _request(
        {
            "namespace": "trainyard",
            "runner_image": "reg/trainyard-runner:0.1.0",
            "scheduler": "kai",
            "queue": "team-a",
            "shm_size": "16Gi",
            "platforms": PLATFORM,
        },
        exec_timeout_s=3600,
    )
    check_golden("seed_kai.yaml", request.render())
    assert validate_strict(request.objects()) == 6  # ConfigMap, Service, 2 Secrets, 2 Pods


@pytest.mark.parametrize("scheduler", ["kai", "volcano", "coscheduling", "none"])
def test_every_scheduler_gives_valid_manifests(scheduler: str) -> None:
    request = _request({"scheduler": scheduler, "queue": "q"})
    validate_strict(request.objects())
    assert (request.podgroup is None) == (scheduler == "none")


def test_owner_references_on_everything_but_the_owner_pass_the_schema() -> None:
    request = _request()
    owner = request.owner["metadata"]["name"]
    owned = [
        with_owner(o, owner, "0d4a6c2e-1111-4222-8333-444455556666") for o in request.objects()[1:]
    ]
    validate_strict([request.owner, *owned])
    assert all(o["metadata"]["ownerReferences"][0]["name"] == "ty-train-multi-gpu-1" for o in owned)
    assert "ownerReferences" not in request.service["metadata"]  # the input is not changed


def test_every_object_carries_the_workflow_labels() -> None:
    request = _request({"scheduler": "volcano"})
    for obj in request.objects():
        assert obj["metadata"]["labels"]["trainyard.io/workflow"] == "train-multi-gpu-1"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "trainyard"
        assert obj["metadata"]["namespace"] == "default"


def test_headless_service_and_pod_dns_names() -> None:
    request = _request({"namespace": "ml", "cluster_domain": "corp.local"})
    service = request.service
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    pod = _pod(request)
    assert pod["spec"]["hostname"] == "master"
    assert (
        pod["spec"]["subdomain"] == service["metadata"]["name"] == "ty-train-multi-gpu-1-training"
    )
    assert set(service["spec"]["selector"].items()) <= set(pod["metadata"]["labels"].items())
    run = request.runs[request.launches[1].key]
    assert run.hosts["master"] == "master.ty-train-multi-gpu-1-training.ml.svc.corp.local"


def test_long_and_odd_names_fit_dns_and_stay_distinct() -> None:
    long_id = "a-very-long-workflow-name-that-keeps-going-and-going-12345"
    request = _request(
        tasks={"Task_A": SEED, "task-a": SEED}, workflow_id=long_id, group="Group.With.Dots"
    )
    names = [p["metadata"]["name"] for p in request.pods]
    hosts = [p["spec"]["hostname"] for p in request.pods]
    for name in names + hosts + [request.service["metadata"]["name"]]:
        assert len(name) <= 63 and name == name.lower() and name[0].isalnum()
    assert len(set(names)) == 2 and len(set(hosts)) == 2
    validate_strict(request.objects())


def test_resources_are_requests_and_equal_limits() -> None:
    request = _request(
        tasks={
            "a": TaskResources(cpu=0.5, gpu=1, memory_bytes=1536 * 1024**2, storage_bytes=3 * GiB)
        }
    )
    resources = _pod(request)["spec"]["containers"][0]["resources"]
    assert (
        resources["requests"]
        == resources["limits"]
        == {"cpu": "500m", "memory": "1536Mi", "nvidia.com/gpu": "1", "ephemeral-storage": "3Gi"}
    )


def test_requests_option_drops_what_the_cluster_is_not_asked() -> None:
    request = _request({"requests": ["memory"]})
    assert _pod(request)["spec"]["containers"][0]["resources"]["limits"] == {"memory": "8Gi"}


def test_platform_placement_merges_over_the_pools() -> None:
    request = _request(
        {"node_selector": {"pool": "gpu"}, "platforms": PLATFORM, "affinity": {"nodeAffinity": {}}}
    )
    spec = _pod(request)["spec"]
    assert spec["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "H100"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert spec["affinity"] == {"nodeAffinity": {}}


def test_shm_is_a_memory_emptydir_at_dev_shm() -> None:
    spec = _pod(_request({"shm_size": "8Gi"}))["spec"]
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]


def test_runner_copied_by_an_init_container_and_run_by_the_task_image() -> None:
    spec = _pod(_request({"runner_image": "r:1", "runner_path": "/opt/ty"}))["spec"]
    init, task = spec["initContainers"][0], spec["containers"][0]
    assert init["image"] == "r:1" and init["command"] == [
        "cp",
        "-a",
        "/opt/ty/.",
        "/trainyard-runner/",
    ]
    assert task["image"] == "nvcr.io/nvidia/pytorch:24.03-py3"
    assert task["command"] == [
        "/opt/ty/venv/bin/python",
        "-m",
        "trainyard.backends.kubernetes.podmain",
        "/etc/trainyard/run.json",
    ]
    assert {"name": "trainyard-runner", "mountPath": "/opt/ty", "readOnly": True} in task[
        "volumeMounts"
    ]


def test_run_json_secret_holds_the_runner_input() -> None:
    request = _request()
    run = TaskRun.model_validate_json(request.secrets[0]["stringData"]["run.json"])
    assert run == request.runs[request.launches[0].key]  # defaults left out, filled back
    assert run.task == "master" and run.sandbox.root is None
    assert request.secrets[0]["metadata"]["name"] == request.pods[0]["metadata"]["name"]


def test_without_runs_claim_the_run_folder_is_an_emptydir_and_no_file_barrier() -> None:
    request = _request()
    assert not request.runs[request.launches[0].key].barrier.enabled
    runs = next(v for v in _pod(request)["spec"]["volumes"] if v["name"] == "runs")
    assert runs == {"name": "runs", "emptyDir": {}}


def test_runs_claim_is_mounted_at_the_homes_runs_and_keeps_the_barrier() -> None:
    request = _request({"runs_claim": "ty-runs"})
    assert request.runs[request.launches[0].key].barrier.enabled
    mounts = _pod(request)["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "runs", "mountPath": str(HOME / "runs")} in mounts


@pytest.mark.parametrize(
    ("scheduler", "label", "annotation"),
    [
        ("kai", "kai.scheduler/queue", "pod-group-name"),
        ("volcano", None, "scheduling.k8s.io/group-name"),
        ("coscheduling", "scheduling.x-k8s.io/pod-group", None),
    ],
)
def test_gang_scheduler_podgroup_and_pod_marks(
    scheduler: str, label: str | None, annotation: str | None
) -> None:
    request = _request({"scheduler": scheduler, "queue": "q"}, retry_id=2)
    group = request.podgroup
    assert group is not None and group["spec"]["minMember"] == 2
    assert group["metadata"]["name"] == "ty-train-multi-gpu-1-training-g2"
    meta = _pod(request)["metadata"]
    if annotation:
        assert meta["annotations"][annotation] == group["metadata"]["name"]
    if label:
        assert label in meta["labels"]
    assert _pod(request)["spec"]["schedulerName"]


def test_scheduler_none_uses_the_default_scheduler() -> None:
    assert "schedulerName" not in _pod(_request({"scheduler": "none"}))["spec"]


def test_host_network_only_where_the_pool_allows_it() -> None:
    with pytest.raises(BackendError, match="hostNetwork"):
        _request(host_network=True)
    spec = _pod(_request(pool_fields={"allow_host_network": True}, host_network=True))["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_privileged_only_where_the_pool_allows_it() -> None:
    with pytest.raises(BackendError, match="privileged"):
        _request(privileged=True)
    container = _pod(_request({"allow_privileged": True}, privileged=True))["spec"]["containers"][0]
    assert container["securityContext"] == {"privileged": True}


def test_volume_mounts_are_host_paths_under_allowed_mounts() -> None:
    with pytest.raises(BackendError, match="allowed_mounts"):
        _request(volume_mounts=["/etc:/host-etc"])
    request = _request({"allowed_mounts": ["/mnt/data"]}, volume_mounts=["/mnt/data/set:/data"])
    spec = _pod(request)["spec"]
    assert {"name": "host-0", "hostPath": {"path": "/mnt/data/set"}} in spec["volumes"]
    validate_strict(request.objects())


def test_exec_timeout_gives_an_active_deadline_backstop() -> None:
    spec = _pod(_request({"time_margin_s": 60}, exec_timeout_s=3600.5))["spec"]
    assert spec["activeDeadlineSeconds"] == 3661


def test_unknown_option_is_refused_listing_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"schedular.*options: namespace"):
        parse_options("k8s", {"schedular": "kai"})


def test_strict_validation_would_catch_a_misspelt_field() -> None:
    pod = _request().pods[0]
    pod["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(AssertionError, match="not valid"):
        validate_strict([pod])


def test_task_inputs_need_the_runs_claim() -> None:
    inputs = [{"kind": "task", "name": "fetch", "source": "/srv/x/runs/w/fetch/0/output"}]
    with pytest.raises(BackendError, match="runs_claim"):
        _request(inputs=inputs)
    assert _request({"runs_claim": "ty-runs"}, inputs=inputs).pods


NGC = {"registry": "nvcr.io", "username": "$oauthtoken", "auth": "ngc-api-key"}
"""A REGISTRY credential as ``trainyard credential set ngc --type REGISTRY --payload
registry=nvcr.io username='$oauthtoken' auth=...`` stores it (OSMO's example)."""


def _with_registries(
    credentials: list[dict[str, str]], images: list[str | None]
) -> KubernetesRequest:
    ls = launches({"master": SEED, "worker": SEED})
    for launch, image in zip(ls, images, strict=True):
        launch.run["image"] = image
        launch.registry_credentials = credentials
    the_pool = pool({"image_pull_secrets": ["site-wide"]})
    return build_request(ls, the_pool, parse_options("k8s", dict(the_pool.options)), HOME)


def test_a_registry_credential_is_a_dockerconfigjson_secret_for_the_pods_on_it() -> None:
    """Issue 26: the submitter's REGISTRY credential for the registry of a task's image
    becomes a Secret of type kubernetes.io/dockerconfigjson in the workflow's namespace,
    named in that pod's imagePullSecrets (after the pool's own); a pod whose image is on
    another registry gets none of it."""
    request = _with_registries(
        [NGC, {"registry": "ghcr.io", "auth": "dXNlcjpwdw=="}],
        ["nvcr.io/nvidia/pytorch:24.03-py3", "busybox:1.36"],
    )
    check_golden("seed_registry.yaml", request.render())
    [secret] = request.pull_secrets
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"]["namespace"] == request.namespace
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert config == {
        "auths": {
            "nvcr.io": {
                "username": "$oauthtoken",
                "password": "ngc-api-key",
                "auth": base64.b64encode(b"$oauthtoken:ngc-api-key").decode(),
            }
        }
    }
    name = secret["metadata"]["name"]
    assert _pod(request, 0)["spec"]["imagePullSecrets"] == [{"name": "site-wide"}, {"name": name}]
    assert _pod(request, 1)["spec"]["imagePullSecrets"] == [{"name": "site-wide"}]
    assert validate_strict(request.objects()) == 6 + 1
    owned = with_owner(
        secret, request.owner["metadata"]["name"], "0d4a6c2e-1111-4222-8333-444455556666"
    )
    validate_strict([owned])  # deleted with the workflow's owner ConfigMap


def test_docker_hub_images_match_a_docker_io_credential_and_auth_alone_is_kept() -> None:
    hub = {"registry": "https://index.docker.io/v1/", "auth": "dXNlcjpwdw=="}
    request = _with_registries([hub], ["python:3.11-slim", "docker.io/library/busybox"])
    [secret] = request.pull_secrets
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert config == {"auths": {"https://index.docker.io/v1/": {"auth": "dXNlcjpwdw=="}}}
    assert all(len(p["spec"]["imagePullSecrets"]) == 2 for p in request.pods)


def test_no_registry_credential_no_pull_secret() -> None:
    request = _with_registries([], ["nvcr.io/nvidia/pytorch:24.03-py3", None])
    assert request.pull_secrets == []
    assert "ngc-api-key" not in request.render()
