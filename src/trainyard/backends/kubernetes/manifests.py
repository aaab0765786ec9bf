"""A placed gang as Kubernetes manifests, built apart from sending them (STYLE.md #3):
``--dry-run`` prints exactly what would be created, golden files pin it, and tests validate
every built-in object against Kubernetes' own OpenAPI schemas.

Per workflow an owner ConfigMap ``ty-<workflow>`` (every other object has an ownerReference to
it: Kubernetes docs, "Garbage Collection"); per group a headless Service; per task attempt a
Pod (``restartPolicy: Never``) and a Secret holding ``run.json``; per registry an image pull
Secret; per gang start a PodGroup of the pool's scheduler (``kai``, ``volcano``,
``coscheduling``; ``none``: the runner's barrier). Requests equal limits (Guaranteed QoS).
``hostNetwork``/``privileged`` where the pool does not allow them: BackendError.
The mapping object by object, with its Kubernetes doc sections: docs/kubernetes.md.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainyard.backends.base import TaskKey, TaskLaunch, TaskResources
from trainyard.backends.images import DOCKER_HUB, image_registry, registry_host
from trainyard.backends.kubernetes import names
from trainyard.backends.kubernetes.options import KubernetesOptions
from trainyard.errors import BackendError
from trainyard.pools import Pool
from trainyard.runfile import SandboxSettings, TaskRun

__all__ = [
    "KubernetesRequest",
    "build_request",
    "with_owner",
    "task_host",
    "RUN_SPEC_DIR",
    "RUNNER_VOLUME_PATH",
    "TASK_CONTAINER",
    "INIT_CONTAINER",
    "POD_ENTRY",
    "ANNOTATIONS",
    "PODGROUP_KINDS",
    "dump_yaml",
    "run_secret",
    "pull_secret",
    "run_json",
    "resources_of",
    "cpu_quantity",
    "bytes_quantity",
]

RUN_SPEC_DIR = "/etc/trainyard"
RUNNER_VOLUME_PATH = "/trainyard-runner"
TASK_CONTAINER = "task"
INIT_CONTAINER = "trainyard-runner"
POD_ENTRY = "trainyard.backends.kubernetes.podmain"
ANNOTATIONS = {
    "workflow": "trainyard.io/workflow-id",
    "group": "trainyard.io/group-name",
    "task": "trainyard.io/task-name",
    "retry": "trainyard.io/retry-id",
}
"""The attempt's exact trainyard names on its pod (labels may be cut or changed)."""

PODGROUP_KINDS: dict[str, tuple[str, str]] = {
    "kai": ("scheduling.run.ai/v2alpha2", "podgroups"),
    "volcano": ("scheduling.volcano.sh/v1beta1", "podgroups"),
    "coscheduling": ("scheduling.x-k8s.io/v1alpha1", "podgroups"),
}
"""Gang scheduler -> (apiVersion, plural) of its PodGroup."""

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass
class KubernetesRequest:
    """Everything one gang start creates, before it is sent.

    Attributes:
        namespace: where every object goes.
        owner: the workflow's owner ConfigMap (made once per workflow; 409 on later starts).
        service: the group's headless Service (made once per group; 409 later).
        podgroup: the gang scheduler's PodGroup of this start (None for ``scheduler: none``).
        pull_secrets: the image pull Secrets of the registries of its pods' images that the
            submitter has a REGISTRY credential for (made once per workflow; 409 later).
        secrets: one per attempt, its ``run.json`` (launch order).
        pods: one per attempt (launch order).
        runs: each attempt's runner input as the pod gets it.
        launches: what this request was built from.
    """

    namespace: str
    owner: dict[str, Any]
    service: dict[str, Any]
    podgroup: dict[str, Any] | None
    secrets: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    runs: dict[TaskKey, TaskRun] = field(default_factory=dict)
    launches: list[TaskLaunch] = field(default_factory=list)
    pull_secrets: list[dict[str, Any]] = field(default_factory=list)

    def objects(self) -> list[dict[str, Any]]:
        """Every object, in creation order: owner, Service, PodGroup, image pull Secrets,
        Secrets, Pods."""
        head = [self.owner, self.service] + ([self.podgroup] if self.podgroup else [])
        return head + self.pull_secrets + self.secrets + self.pods

    def render(self) -> str:
        """What ``--dry-run`` prints: every object as a YAML document (``kubectl apply -f -``),
        after a comment that says what sending adds."""
        note = (
            f"# trainyard: {len(self.pods)} pod(s) of group {self.launches[0].group!r} of "
            f"workflow {self.launches[0].key.workflow_id}; sent, every object but the "
            f"ConfigMap also gets an ownerReference to ConfigMap {self.owner['metadata']['name']}"
            " (it needs its uid) and the Secrets the task token\n"
        )
        return note + dump_yaml(self.objects())


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks (``run.json``, scripts), readable in a dry run;
    no anchors and aliases (a Service's labels and selector are one dict)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(objects: list[dict[str, Any]]) -> str:
    """``objects`` as YAML documents separated by ``---``, keys in built order."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=100)


def with_owner(obj: dict[str, Any], owner_name: str, owner_uid: str) -> dict[str, Any]:
    """``obj`` with an ownerReference to the workflow's ConfigMap (Kubernetes docs, "Owners
    and Dependents": a namespaced owner in the same namespace). Returns a new dict."""
    meta = {
        **obj["metadata"],
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": owner_name, "uid": owner_uid}
        ],
    }
    return {**obj, "metadata": meta}


# --------------------------------------------------------------------------- quantities


def cpu_quantity(cores: float) -> str:
    """Cores as a quantity: whole cores as ``"4"``, else millicores (``"500m"``, rounded up)."""
    if abs(cores - round(cores)) < 1e-9:
        return str(int(round(cores)))
    return f"{math.ceil(cores * 1000 - 1e-6)}m"


def bytes_quantity(count: int) -> str:
    """Bytes as a quantity with the largest binary suffix that divides them (``"8Gi"``)."""
    for suffix, size in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if count % size == 0:
            return f"{count // size}{suffix}"
    return str(count)


def resources_of(res: TaskResources, options: KubernetesOptions) -> dict[str, Any]:
    """The container's ``resources``: requests equal to limits, only what the pool's
    ``requests`` names and the task asks (an empty dict: nothing asked)."""
    amounts: dict[str, str] = {}
    if res.cpu > 0 and "cpu" in options.requests:
        amounts["cpu"] = cpu_quantity(res.cpu)
    if res.memory_bytes > 0 and "memory" in options.requests:
        amounts["memory"] = bytes_quantity(res.memory_bytes)
    if res.gpu > 0 and "gpu" in options.requests:
        amounts[GPU_RESOURCE] = str(res.gpu)
    if res.storage_bytes > 0 and "storage" in options.requests:
        amounts["ephemeral-storage"] = bytes_quantity(res.storage_bytes)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


# --------------------------------------------------------------------------- metadata


def task_host(task: str, service: str, options: KubernetesOptions) -> str:
    """``{{host:TASK}}``: the pod's fully qualified name under its group's Service."""
    return f"{names.hostname(task)}.{service}.{options.namespace}.svc.{options.cluster_domain}"


def _meta(
    name: str,
    options: KubernetesOptions,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": options.namespace, "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    return meta


def _group_labels(launch: TaskLaunch) -> dict[str, str]:
    return {
        **names.workflow_labels(launch.key.workflow_id),
        names.GROUP_LABEL: names.label_value(launch.group),
    }


def _owner(workflow_id: str, options: KubernetesOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(
            names.owner_name(workflow_id),
            options,
            names.workflow_labels(workflow_id),
            {ANNOTATIONS["workflow"]: workflow_id},
        ),
        "data": {"workflow-id": workflow_id},
    }


def _service(launch: TaskLaunch, options: KubernetesOptions) -> dict[str, Any]:
    labels = _group_labels(launch)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(
            names.service_name(launch.key.workflow_id, launch.group),
            options,
            labels,
            {ANNOTATIONS["group"]: launch.group},
        ),
        "spec": {"clusterIP": "None", "selector": labels, "publishNotReadyAddresses": True},
    }


def _podgroup(
    launches: list[TaskLaunch], options: KubernetesOptions, name: str
) -> dict[str, Any] | None:
    """The PodGroup of this gang start (None for ``scheduler: none``)."""
    if options.scheduler == "none":
        return None
    api_version = PODGROUP_KINDS[options.scheduler][0]
    spec: dict[str, Any] = {"minMember": len(launches)}
    if options.queue and options.scheduler in ("kai", "volcano"):
        spec["queue"] = options.queue
    if options.scheduler == "coscheduling":
        spec["scheduleTimeoutSeconds"] = int(options.gang_timeout_s)
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": _meta(name, options, _group_labels(launches[0])),
        "spec": spec,
    }


def _gang_marks(options: KubernetesOptions, podgroup: str) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that tie a pod to its PodGroup, per scheduler."""
    if options.scheduler == "kai":
        labels = {"kai.scheduler/queue": options.queue} if options.queue else {}
        return labels, {"pod-group-name": podgroup}
    if options.scheduler == "volcano":
        return {}, {"scheduling.k8s.io/group-name": podgroup}
    if options.scheduler == "coscheduling":
        return {"scheduling.x-k8s.io/pod-group": podgroup}, {}
    return {}, {}


# --------------------------------------------------------------------------- pods


def _placement(launch: TaskLaunch, pool: Pool, options: KubernetesOptions) -> dict[str, Any]:
    """nodeSelector, tolerations and affinity: the pool's, the node's platform's over them."""
    node = next((n for n in pool.nodes if n.name == launch.node), None)
    platform = options.platforms.get(node.platform) if node and node.platform else None
    selector = {**options.node_selector, **(platform.node_selector if platform else {})}
    tolerations = options.tolerations + (platform.tolerations if platform else [])
    affinity = platform.affinity if platform and platform.affinity else options.affinity
    out: dict[str, Any] = {}
    if selector:
        out["nodeSelector"] = selector
    if tolerations:
        out["tolerations"] = tolerations
    if affinity:
        out["affinity"] = affinity
    return out


def _allowed(source: str, allowed: list[str]) -> bool:
    return any(source == p or source.startswith(p.rstrip("/") + "/") for p in allowed)


def _mounts(
    run: TaskRun, options: KubernetesOptions
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) for the task's ``volumeMounts`` (hostPath, each allowed by
    ``allowed_mounts``) and the pool's claims. Raises BackendError for a mount not allowed."""
    allowed = (
        [options.allowed_mounts]
        if isinstance(options.allowed_mounts, str)
        else list(options.allowed_mounts)
    )
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for index, entry in enumerate(run.volume_mounts):
        source, _, target = entry.partition(":")
        if not _allowed(source, allowed):
            raise BackendError(
                f"task {run.task}: volume mount {entry!r} is not under the "
                f"pool's allowed_mounts ({', '.join(allowed) or 'none'})"
            )
        volumes.append({"name": f"host-{index}", "hostPath": {"path": source}})
        mounts.append({"name": f"host-{index}", "mountPath": target or source})
    for index, claim in enumerate(options.claims):
        volumes.append(
            {
                "name": f"claim-{index}",
                "persistentVolumeClaim": {"claimName": claim.claim, "readOnly": claim.read_only},
            }
        )
        mounts.append(
            {"name": f"claim-{index}", "mountPath": claim.mount_path, "readOnly": claim.read_only}
        )
    return volumes, mounts


def _run_volume(
    launch: TaskLaunch, options: KubernetesOptions, home: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) of the run folder: the runs claim at ``<home>/runs``, else an
    emptyDir at the attempt's own run folder."""
    if options.runs_claim:
        return (
            {"name": "runs", "persistentVolumeClaim": {"claimName": options.runs_claim}},
            {"name": "runs", "mountPath": str(home / "runs")},
        )
    return {"name": "runs", "emptyDir": {}}, {"name": "runs", "mountPath": str(launch.run_dir)}


def _security(
    run: TaskRun, pool: Pool, options: KubernetesOptions, privileged: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod fields, container securityContext) for hostNetwork and privileged."""
    if run.host_network and not pool.allow_host_network:
        raise BackendError(
            f"task {run.task}: hostNetwork is not allowed on pool {pool.name!r} "
            "(allow_host_network: true in pools.yaml)"
        )
    if privileged and not options.allow_privileged:
        raise BackendError(
            f"task {run.task}: privileged is not allowed on pool {pool.name!r} "
            "(options.allow_privileged: true in pools.yaml)"
        )
    pod: dict[str, Any] = {}
    if run.host_network:
        pod = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    return pod, ({"securityContext": {"privileged": True}} if privileged else {})


def _volumes(
    launch: TaskLaunch, run: TaskRun, options: KubernetesOptions, home: Path, secret: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every volume of the pod and the task container's mounts."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if options.shm_size:
        shm["sizeLimit"] = options.shm_size
    run_volume, run_mount = _run_volume(launch, options, home)
    extra_volumes, extra_mounts = _mounts(run, options)
    volumes: list[dict[str, Any]] = [
        {"name": "trainyard-runner", "emptyDir": {}},
        {"name": "run-spec", "secret": {"secretName": secret, "defaultMode": 0o444}},
        {"name": "dshm", "emptyDir": shm},
        run_volume,
        *extra_volumes,
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "trainyard-runner", "mountPath": options.runner_path, "readOnly": True},
        {"name": "run-spec", "mountPath": RUN_SPEC_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        run_mount,
        *extra_mounts,
    ]
    return volumes, mounts


def _init_container(options: KubernetesOptions) -> dict[str, Any]:
    """Copies the runner image's ``runner_path`` into the shared emptyDir."""
    return {
        "name": INIT_CONTAINER,
        "image": options.runner_image,
        "imagePullPolicy": options.image_pull_policy,
        "command": ["cp", "-a", f"{options.runner_path}/.", f"{RUNNER_VOLUME_PATH}/"],
        "volumeMounts": [{"name": "trainyard-runner", "mountPath": RUNNER_VOLUME_PATH}],
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        },
    }


def _task_container(
    launch: TaskLaunch,
    run: TaskRun,
    options: KubernetesOptions,
    mounts: list[dict[str, Any]],
    security: dict[str, Any],
) -> dict[str, Any]:
    python = f"{options.runner_path}/venv/bin/python"
    container: dict[str, Any] = {
        "name": TASK_CONTAINER,
        "image": run.image or options.default_image,
        "imagePullPolicy": options.image_pull_policy,
        "command": [python, "-m", POD_ENTRY, f"{RUN_SPEC_DIR}/run.json"],
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = resources_of(launch.resources, options)
    if resources:
        container["resources"] = resources
    return {**container, **security}


def _pod(launch: TaskLaunch, run: TaskRun, ctx: _Context) -> dict[str, Any]:
    key = launch.key
    name = names.pod_name(key.workflow_id, key.task, key.retry_id)
    gang_labels, gang_annotations = _gang_marks(ctx.options, ctx.podgroup)
    labels = {
        **_group_labels(launch),
        names.TASK_LABEL: names.label_value(key.task),
        names.RETRY_LABEL: str(key.retry_id),
        names.START_LABEL: ctx.podgroup,
        **gang_labels,
    }
    annotations = {
        ANNOTATIONS["workflow"]: key.workflow_id,
        ANNOTATIONS["group"]: launch.group,
        ANNOTATIONS["task"]: key.task,
        ANNOTATIONS["retry"]: str(key.retry_id),
        **gang_annotations,
    }
    pod_security, container_security = _security(
        run, ctx.pool, ctx.options, bool(launch.run.get("privileged"))
    )
    volumes, mounts = _volumes(launch, run, ctx.options, ctx.home, name)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": names.hostname(key.task),
        "subdomain": ctx.service,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": ctx.options.stop_grace_s,
    }
    if ctx.options.pod_scheduler_name:
        spec["schedulerName"] = ctx.options.pod_scheduler_name
    if ctx.options.service_account:
        spec["serviceAccountName"] = ctx.options.service_account
    if launch.exec_timeout_s is not None:
        spec["activeDeadlineSeconds"] = math.ceil(launch.exec_timeout_s + ctx.options.time_margin_s)
    pulls = list(ctx.options.image_pull_secrets) + [
        secret["metadata"]["name"] for secret in ctx.pull_secrets.get(key, [])
    ]
    if pulls:
        spec["imagePullSecrets"] = [{"name": s} for s in pulls]
    spec.update(pod_security)
    spec.update(_placement(launch, ctx.pool, ctx.options))
    spec["initContainers"] = [_init_container(ctx.options)]
    spec["containers"] = [_task_container(launch, run, ctx.options, mounts, container_security)]
    spec["volumes"] = volumes
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(name, ctx.options, labels, annotations),
        "spec": spec,
    }


def run_secret(launch: TaskLaunch, run: TaskRun, options: KubernetesOptions) -> dict[str, Any]:
    """The attempt's Secret holding its ``run.json`` (named as its pod)."""
    key = launch.key
    labels = {
        **_group_labels(launch),
        names.TASK_LABEL: names.label_value(key.task),
        names.RETRY_LABEL: str(key.retry_id),
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(names.pod_name(key.workflow_id, key.task, key.retry_id), options, labels),
        "stringData": {"run.json": run_json(run)},
    }


def _docker_auth(payload: dict[str, str]) -> dict[str, str]:
    """A REGISTRY payload as one ``auths`` entry of a Docker config: with a ``username``,
    ``auth`` is its password (OSMO's NGC example: ``username=$oauthtoken auth=<API key>``)
    and the entry gets Docker's ``auth`` (base64 of ``username:password``); without one,
    ``auth`` is Docker's already."""
    username = payload.get("username")
    if not username:
        return {"auth": payload["auth"]}
    both = base64.b64encode(f"{username}:{payload['auth']}".encode()).decode()
    return {"username": username, "password": payload["auth"], "auth": both}


def pull_secret(
    launch: TaskLaunch, image: str, options: KubernetesOptions
) -> dict[str, Any] | None:
    """The image pull Secret of ``image``'s registry from the first of the launch's REGISTRY
    credentials for it (``images.image_registry``; a payload without ``registry`` is Docker
    Hub's), else None."""
    for payload in launch.registry_credentials:
        registry = payload.get("registry") or DOCKER_HUB
        if payload.get("auth") and registry_host(registry) == image_registry(image):
            config = json.dumps({"auths": {registry: _docker_auth(payload)}}, sort_keys=True)
            return {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/dockerconfigjson",
                "metadata": _meta(
                    names.pull_secret_name(launch.key.workflow_id, image_registry(image)),
                    options,
                    names.workflow_labels(launch.key.workflow_id),
                ),
                "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()},
            }
    return None


def _pull_secrets(
    launches: list[TaskLaunch], runs: dict[TaskKey, TaskRun], options: KubernetesOptions
) -> dict[TaskKey, list[dict[str, Any]]]:
    """Each attempt's image pull Secrets (none, or its image's registry's)."""
    found = {}
    for launch in launches:
        image = runs[launch.key].image or options.default_image
        secret = pull_secret(launch, image, options)
        found[launch.key] = [secret] if secret else []
    return found


def run_json(run: TaskRun) -> str:
    """The runner's input as the Secret holds it: indented (readable in a dry run), fields at
    their defaults left out (the runner fills them in again; a new runner field changes no
    manifest)."""
    return json.dumps(run.model_dump(mode="json", exclude_defaults=True), indent=2) + "\n"


# --------------------------------------------------------------------------- runner input


def _task_run(
    launch: TaskLaunch,
    options: KubernetesOptions,
    pod: str,
    hosts: dict[str, str],
    server_url: str | None,
) -> TaskRun:
    run = TaskRun.model_validate(launch.run)
    _check_task_inputs(run, options)
    run.hosts = {**run.hosts, **hosts}
    if not options.runs_claim:  # no folder every pod of the gang sees: no file barrier
        run.barrier.enabled = False
    image = run.image or options.default_image
    run.sandbox = SandboxSettings(
        env={"TRAINYARD_SERVER_URL": server_url} if server_url else {},
        description=(
            f"kubernetes backend: pod {pod} in namespace {options.namespace}, "
            f"image {image}; the container is the task's own root"
        ),
        summary=f"kubernetes pod {pod}, image {image}",
    )
    return run


def _check_task_inputs(run: TaskRun, options: KubernetesOptions) -> None:
    """A ``task:`` input copies an upstream task's output folder, which a pod sees only on
    the pool's ``runs_claim``. Raises BackendError without one (before anything is made)."""
    upstream = [i.name for i in run.inputs if i.kind == "task" and not i.unavailable]
    if upstream and not options.runs_claim:
        raise BackendError(
            f"task {run.task}: its inputs from task {', '.join(upstream)} need a folder every "
            "pod sees: set options.runs_claim (a ReadWriteMany PersistentVolumeClaim) on the "
            "pool, or pass the data through URLs (s3://...)"
        )


@dataclass
class _Context:
    options: KubernetesOptions
    pool: Pool
    home: Path
    service: str
    podgroup: str
    hosts: dict[str, str]
    pull_secrets: dict[TaskKey, list[dict[str, Any]]] = field(default_factory=dict)


def build_request(
    launches: list[TaskLaunch],
    pool: Pool,
    options: KubernetesOptions,
    home: Path,
    *,
    server_url: str | None = None,
) -> KubernetesRequest:
    """The manifests of one gang start (no side effects).

    Args:
        launches: the attempts to start together (a whole gang, or the retried part of one).
        pool: the pool (its nodes' platforms, ``allow_host_network``).
        options: the pool's options.
        home: ``$TRAINYARD_HOME`` (run folders under ``home/runs``, where ``runs_claim`` goes).
        server_url: the trainyard server the tasks' own CLI talks to.

    Raises:
        ValueError: ``launches`` is empty.
        BackendError: a task asks what the pool does not allow (hostNetwork, privileged,
            a volume mount outside ``allowed_mounts``).
    """
    if not launches:
        raise ValueError("a gang start needs at least one task")
    first = launches[0]
    service = names.service_name(first.key.workflow_id, first.group)
    group_tasks = TaskRun.model_validate(first.run).group_tasks
    generation = max(launch.key.retry_id for launch in launches)
    ctx = _Context(
        options,
        pool,
        Path(home),
        service,
        names.podgroup_name(first.key.workflow_id, first.group, generation),
        {t: task_host(t, service, options) for t in group_tasks},
    )
    runs = {
        launch.key: _task_run(
            launch,
            options,
            names.pod_name(launch.key.workflow_id, launch.key.task, launch.key.retry_id),
            ctx.hosts,
            server_url,
        )
        for launch in launches
    }
    ctx.pull_secrets = _pull_secrets(launches, runs, options)
    distinct = {s["metadata"]["name"]: s for made in ctx.pull_secrets.values() for s in made}
    return KubernetesRequest(
        pull_secrets=list(distinct.values()),
        namespace=options.namespace,
        owner=_owner(first.key.workflow_id, options),
        service=_service(first, options),
        podgroup=_podgroup(launches, options, ctx.podgroup),
        secrets=[run_secret(launch, runs[launch.key], options) for launch in launches],
        pods=[_pod(launch, runs[launch.key], ctx) for launch in launches],
        runs=runs,
        launches=list(launches),
    )
