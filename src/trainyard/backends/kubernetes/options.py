"""The Kubernetes backend's pool options (``pools.yaml``: ``options:`` of a ``backend:
kubernetes`` pool): ``namespace``, ``runner_image``, ``scheduler`` (``kai`` | ``volcano`` |
``coscheduling`` | ``none``), ``queue``, ``platforms`` (``node_selector``, ``tolerations``,
``affinity`` per platform) and the rest. ``examples/kubernetes/pools.yaml`` is a commented
example; every option is explained in docs/kubernetes.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from trainyard.backends.base import parse_pool_options

__all__ = [
    "KubernetesOptions",
    "PlatformOptions",
    "ClaimMount",
    "Scheduler",
    "parse_options",
    "SCHEDULER_NAMES",
]

Scheduler = Literal["kai", "volcano", "coscheduling", "none"]

SCHEDULER_NAMES: dict[str, str | None] = {
    "kai": "kai-scheduler",  # NVIDIA KAI scheduler's default name (what OSMO deploys)
    "volcano": "volcano",
    "coscheduling": "scheduler-plugins-scheduler",  # scheduler-plugins' Helm chart default
    "none": None,  # the cluster's default scheduler
}
"""A pool's ``scheduler`` -> the pods' ``spec.schedulerName`` unless ``scheduler_name`` is set."""

DnsLabel = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
"""A DNS-1123 label (namespaces, claim names): Kubernetes "Object Names and IDs"."""


_ALL_REQUESTS: tuple[Literal["cpu", "memory", "gpu", "storage"], ...] = (
    "cpu",
    "memory",
    "gpu",
    "storage",
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlatformOptions(_Model):
    """Where a platform's pods go (OSMO's pod templates per platform): merged over the pool's
    own ``node_selector``/``tolerations``/``affinity``, the platform's winning.

    Attributes:
        node_selector: ``spec.nodeSelector`` entries.
        tolerations: ``spec.tolerations`` items, as in a pod manifest.
        affinity: ``spec.affinity``, as in a pod manifest (replaces the pool's whole).
    """

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None


class ClaimMount(_Model):
    """A PersistentVolumeClaim every pod of the pool mounts (a shared dataset folder)."""

    claim: DnsLabel
    mount_path: str = Field(pattern=r"^/")
    read_only: bool = False


class KubernetesOptions(_Model):
    """A Kubernetes pool's options; every field has a default.

    Attributes:
        namespace: where every object of the pool's workflows is made.
        kubeconfig, context: the cluster (None: ``$KUBECONFIG``/``~/.kube/config``, else the
            in-cluster service account, as ``kubectl`` finds it).
        server_url: the trainyard server's URL as pods reach it (``osmo``/``trainyard`` inside
            a task; ``deploy/kubernetes``' Service); None: the server's own
            (``base.server_url_for_tasks``), which pods reach only where it is routable.
        cluster_domain: the cluster's DNS domain (``{{host:TASK}}`` is
            ``<task>.<group service>.<namespace>.svc.<cluster_domain>``).
        runner_image: the image holding trainyard's runner under ``runner_path``
            (``deploy/runner/Dockerfile``); its init container copies it into each pod.
        runner_path: where the runner image holds it, and where the task's container
            mounts the copy (the same path, so the venv's absolute paths hold).
        default_image: the image of a task whose spec names none.
        image_pull_policy: the pods' containers' ``imagePullPolicy``.
        image_pull_secrets: Secrets of the namespace used to pull images.
        service_account: the pods' ``serviceAccountName`` (None: the namespace's default;
            its token is not mounted either way).
        scheduler: the gang scheduler that admits a group's pods together: ``kai``,
            ``volcano``, ``coscheduling`` (each with a PodGroup) or ``none``.
        scheduler_name: the pods' ``schedulerName`` (default per ``scheduler``,
            ``SCHEDULER_NAMES``).
        queue: the KAI or Volcano queue of the PodGroups (and KAI's queue label).
        gang_timeout_s: with ``scheduler: none``, a gang not all running this long after its
            start is deleted and its attempts exit with 3005 (START_TIMEOUT);
            with a gang scheduler, the coscheduling PodGroup's ``scheduleTimeoutSeconds``.
        node_selector, tolerations, affinity: for every pod; ``platforms`` add per platform.
        platforms: per OSMO platform name (a node's ``platform`` in the pool).
        requests: which task resources become requests and limits (default all four).
        shm_size: the ``/dev/shm`` emptyDir's ``sizeLimit`` (a quantity; None: no limit,
            it counts against the container's memory limit either way).
        allow_privileged: a task's ``privileged: true`` becomes a privileged container;
            without it such a task is refused at start.
        claims: PersistentVolumeClaims mounted into every pod.
        runs_claim: a ReadWriteMany claim holding ``$TRAINYARD_HOME/runs`` for every pod (at
            that path): run folders, ``task:`` inputs, the barrier's folder and events the
            server can read. None: each attempt's run folder is an emptyDir of its pod, and
            the runner's barrier is off (the gang scheduler, or ``gang_timeout_s``, holds the
            gang).
        stop_grace_s: ``terminationGracePeriodSeconds`` (SIGTERM -> SIGKILL) of stops.
        time_margin_s: ``activeDeadlineSeconds`` is the exec timeout plus this (a backstop;
            the engine's exec timeout rule ends the group first).
        lost_grace_s: how long a pod may be gone (deleted, its node lost) before LOST.
        allowed_mounts, allowed_data_roots: options of every pool (``spec.poolfit``,
            ``dataroots``); a spec's ``volumeMounts`` under ``allowed_mounts`` become hostPath
            volumes.
    """

    namespace: DnsLabel = "default"
    kubeconfig: str | None = None
    context: str | None = None
    server_url: str | None = None
    cluster_domain: str = "cluster.local"
    runner_image: str = "trainyard-runner:0.1.0"
    runner_path: str = Field(default="/opt/trainyard", pattern=r"^/[^:]*$")
    default_image: str = "python:3.12-slim"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[DnsLabel] = Field(default_factory=list)
    service_account: DnsLabel | None = None
    scheduler: Scheduler = "none"
    scheduler_name: str | None = None
    queue: str | None = None
    gang_timeout_s: float = Field(default=600.0, gt=0)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    platforms: dict[str, PlatformOptions] = Field(default_factory=dict)
    requests: list[Literal["cpu", "memory", "gpu", "storage"]] = Field(
        default_factory=lambda: list(_ALL_REQUESTS)
    )
    shm_size: str | None = None
    allow_privileged: bool = False
    claims: list[ClaimMount] = Field(default_factory=list)
    runs_claim: DnsLabel | None = None
    stop_grace_s: int = Field(default=30, ge=0)
    time_margin_s: float = Field(default=600.0, ge=0)
    lost_grace_s: float = Field(default=3.0, ge=0)
    allowed_mounts: list[str] | str = Field(default_factory=list)
    allowed_data_roots: list[str] | str | None = None

    @property
    def pod_scheduler_name(self) -> str | None:
        """The pods' ``schedulerName`` (None: the cluster's default scheduler)."""
        return self.scheduler_name or SCHEDULER_NAMES[self.scheduler]


def parse_options(pool_name: str, options: dict[str, Any]) -> KubernetesOptions:
    """Validate a pool's ``options``.

    Raises:
        ConfigError: an unknown option or a bad value; the message names the pool and
            lists the valid options.
    """
    return parse_pool_options(KubernetesOptions, pool_name, "kubernetes", options)
