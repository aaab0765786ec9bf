"""How a local task is isolated: one strategy per kind (bubblewrap, podman, none).

``strategy_for(podman, iso)`` picks it; ``Strategy.sandbox`` builds the task's part of its
``SandboxSettings`` in one go (root, command prefix, mounts, overlays, volumes, user
namespace) from the backend's settings and the task's ``LaunchRequest``. The group's network
(``nsenter`` prefix, podman's ``--network ns:``) is the backend's part, not the strategy's.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import sysconfig
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import trainyard
from trainyard.backends.base import TaskKey
from trainyard.backends.images import image_registry
from trainyard.backends.local import container, container_image, image_pull
from trainyard.backends.local.netns import GroupNetwork
from trainyard.backends.local.sandbox import (
    IDMAPPED,
    TASK_HOST_UID,
    SandboxPlan,
    bwrap_argv,
    bwrap_end,
    fresh_paths,
    hosts_file_text,
    needs_bind,
    overlay_supported,
    overlays,
    probe_remap,
    sandbox_mounts,
    skeleton_base,
    task_owned,
)
from trainyard.runfile import TaskRun, UserNamespace

log = logging.getLogger("trainyard.backends.local")

__all__ = [
    "LaunchRequest",
    "Settings",
    "Sandboxing",
    "Strategy",
    "NoSandbox",
    "Bubblewrap",
    "Podman",
    "strategy_for",
]


@dataclass
class LaunchRequest:
    """One task start, built apart from sending it (so it can be printed and tested).

    Attributes:
        argv: how to run the runner by hand (the launcher forks it instead); the sandbox
            prefix of the command is ``run.sandbox.command_prefix``.
        run: the runner's input, ``sandbox`` filled.
        writable_dirs: folders to create before the start (bind sources, outputs).
        hosts_text: ``/etc/hosts`` for the sandbox (bwrap only).
        hosted: the runner runs as a thread of the launcher (``runner.hosted.hostable``).
        joins_group_network: the launcher moves that thread into the group's network
            namespace (made if need be, as root) instead of an ``nsenter`` prefix.
        registry_credentials: the submitter's REGISTRY credentials for the image's
            registry (``TaskLaunch.registry_credentials``): a podman task's missing image
            is pulled with them (``image_pull.pull_image``); never in ``run``.
    """

    key: TaskKey
    run_dir: Path
    argv: list[str]
    run: TaskRun
    root_dir: Path
    writable_dirs: list[Path] = field(default_factory=list)
    hosts_text: str | None = None
    hosted: bool = False
    joins_group_network: bool = False
    plan: SandboxPlan | None = None
    registry_credentials: list[dict[str, str]] = field(default_factory=list, repr=False)


class Settings(Protocol):
    """What a strategy reads of the backend (``LocalBackend``)."""

    home: Path
    state_dir: Path
    insecure_registries: tuple[str, ...]

    def volumes(self, run: TaskRun) -> tuple[tuple[str, str], ...]:
        """``(host folder, path inside)`` of each allowed ``volumeMounts`` entry."""


@functools.lru_cache(maxsize=1)
def _runner_paths() -> tuple[str, ...]:
    """Folders the interpreter and its imports live in (not the engine's script folder): the
    command sees them read-only (``python``, ``torchrun`` of the venv)."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        str(Path(trainyard.__file__).resolve().parent.parent),
    }
    paths.update(sysconfig.get_paths().values())
    paths.update(
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)
    )  # a worktree's src (not sys.path: it holds the cwd)
    return tuple(sorted(p for p in paths if os.path.exists(p)))


@functools.lru_cache(maxsize=1)
def _runner_binds() -> tuple[str, ...]:
    """The ``_runner_paths`` the sandbox must bind again to show them (asked once)."""
    return tuple(p for p in _runner_paths() if needs_bind(p, False))


@functools.lru_cache(maxsize=8)
def _shown_runner_binds(home: Path) -> tuple[str, ...]:
    """``_runner_binds`` without any folder that holds trainyard's home (its tokens, store
    and runs are never shown to a task, whatever the import path says). Asked once per
    home (it was ~18 ``realpath`` calls per task start)."""
    real_home = os.path.realpath(home)
    return tuple(
        p
        for p in _runner_binds()
        if not _inside(real_home, os.path.realpath(p)) and os.path.realpath(p) != "/"
    )


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@dataclass
class Sandboxing:
    """What a strategy decided for one task.

    Attributes:
        settings: fields of the run's ``SandboxSettings`` (``root``, ``command_prefix``,
            ``mounts``, ...), set once.
        hosts_text: the task's ``/etc/hosts`` (None: it sees the host's).
        plan: the bubblewrap plan (its links are cleared before the start).
        network_by_path: the strategy joins the group's namespace itself (podman).
    """

    settings: dict[str, Any] = field(default_factory=dict)
    hosts_text: str | None = None
    plan: SandboxPlan | None = None
    network_by_path: bool = False


class Strategy(ABC):
    """One way of isolating a local task."""

    name: ClassVar[str]

    @abstractmethod
    def sandbox(
        self,
        backend: Settings,
        request: LaunchRequest,
        *,
        remap: bool,
        net: GroupNetwork | None,
        gpus: tuple[int, ...],
    ) -> Sandboxing:
        """The task's sandbox settings. ``request.run.sandbox`` already holds the backend's
        part (``path_prepend``, ``env``, ``limits``, ``description``).

        Args:
            remap: the task's uid 0 may be the host's ``TASK_HOST_UID`` (not when bwrap
                starts inside the group's user namespace).
            net: the group's network namespace, when the task joins it by path.
            gpus: the real GPUs lent to the task.

        Raises:
            BackendError: a volume mount the pool does not allow.
        """


class NoSandbox(Strategy):
    """No sandbox: the task shares the host's ``/``; its ``/tmp`` and file paths are
    rewritten to a private folder (``root``)."""

    name = "none"

    def sandbox(
        self,
        backend: Settings,
        request: LaunchRequest,
        *,
        remap: bool,
        net: GroupNetwork | None,
        gpus: tuple[int, ...],
    ) -> Sandboxing:
        return Sandboxing({"root": str(request.root_dir)})


class Bubblewrap(Strategy):
    """A bubblewrap sandbox of its own (``local.sandbox``): a private writable ``/``, its
    own PID/IPC/UTS/user namespaces, no capabilities."""

    name = "bwrap"

    def sandbox(
        self,
        backend: Settings,
        request: LaunchRequest,
        *,
        remap: bool,
        net: GroupNetwork | None,
        gpus: tuple[int, ...],
    ) -> Sandboxing:
        plan = self.plan(backend, request, remap)
        prefix = bwrap_argv(plan)
        mounts, readonly = sandbox_mounts(plan)
        userns = None
        if plan.host_uid is not None:
            own, below = task_owned(plan)
            userns = UserNamespace(
                host_uid=plan.host_uid,
                host_gid=plan.host_uid,
                own=own,
                own_dirs_below=below,
                fresh=fresh_paths(plan),
                args_at=bwrap_end(prefix),
            )
        settings = {
            "command_prefix": prefix,
            "mounts": mounts,
            "readonly": readonly,
            "overlays": overlays(plan),
            "userns": userns,
            "volumes": {inside: host for host, inside in plan.volumes},
        }
        return Sandboxing(settings, hosts_file_text(request.run.hosts), plan)

    @staticmethod
    def plan(backend: Settings, request: LaunchRequest, remap: bool) -> SandboxPlan:
        """The task's sandbox: its own output and input folders writable (never its run
        folder, the home or the barrier folder: the runner uses those from outside), the
        interpreter and import path read-only, the pool-allowed volume mounts writable.
        With ``remap`` and where ``probe_remap`` works, the task's uid 0 is
        ``TASK_HOST_UID`` of the host."""
        run = request.run
        writable = [str(run.output_path), *(str(run.input_path(i)) for i in range(len(run.inputs)))]
        readonly = run.sandbox.path_prepend  # inputs need none: the runner copies them in
        return SandboxPlan(
            root_dir=request.root_dir,
            hostname=run.task,
            hosts_file=request.run_dir / "sandbox" / "hosts",
            writable=tuple(p for p in writable if needs_bind(p, True)),
            readonly=_shown_runner_binds(backend.home)
            + tuple(p for p in readonly if os.path.exists(p) and needs_bind(p, False)),
            overlay_dir=request.run_dir / "sandbox" / "overlay" if overlay_supported() else None,
            volumes=backend.volumes(run),
            hidden=(str(backend.home),),
            host_uid=TASK_HOST_UID if remap and probe_remap() is None else None,
            idmapped=IDMAPPED,
            skeleton_dir=skeleton_base() if overlay_supported() else None,
        )


class Podman(Strategy):
    """A podman container of the task's image (``local.container``): a runner process
    (never hosted: the container does not die with a thread), the group's namespace by
    path, the task's files, folders, volumes and lent GPUs passed in."""

    name = "podman"

    def sandbox(
        self,
        backend: Settings,
        request: LaunchRequest,
        *,
        remap: bool,
        net: GroupNetwork | None,
        gpus: tuple[int, ...],
    ) -> Sandboxing:
        run = request.run
        assert run.image is not None
        network = "host"
        if net is not None and not run.host_network:
            network = f"ns:{net.ns_path or f'/proc/{net.ns_pid}/ns/net'}"
        devices, visible = container.gpu_devices(gpus)
        name = container.container_name(request.run_dir)
        info = container_image.inspect_image(run.image)
        pull_error = None
        if info is None and request.registry_credentials:
            pull_error = self._pull(backend, request)
            info = None if pull_error else container_image.inspect_image(run.image)
        no_root = container_image.why_no_own_root(info, overlay_supported()) if info else None
        own_root = info is not None and no_root is None
        plan = container.ContainerPlan(
            image=run.image,
            name=name,
            hostname=run.task,
            network=network,
            root_dir=request.root_dir,
            hosts_file=request.run_dir / "sandbox" / "hosts",
            files=tuple(f.path if f.path.startswith("/") else f"/{f.path}" for f in run.files),
            writable=tuple(str(d) for d in request.writable_dirs if Path(d) != request.run_dir),
            volumes=backend.volumes(run),
            devices=devices,
            rootfs=container.rootfs_path(name) if own_root else None,
            image_env=info.env if info is not None and own_root else (),
            id_bases=container_image.task_id_bases() if own_root else None,
            conf=container.containers_conf(backend.state_dir),
            seccomp=container.seccomp_profile(backend.state_dir),
            limits=run.sandbox.limits,
        )
        settings: dict[str, Any] = {
            "limits": None,  # podman's flags set them (its OCI runtime's own group)
            "env": {**run.sandbox.env, "CUDA_VISIBLE_DEVICES": visible},  # CDI: from 0 inside
            "command_prefix": container.podman_argv(plan),
            "mounts": container.container_mounts(plan),
            "userns": container.container_userns(plan),
            "volumes": {inside: host for host, inside in plan.volumes},
            "env_flag": "--env-file",
            "env_defaults": dict(v.partition("=")[::2] for v in plan.image_env),
        }
        if info is None:
            settings["start_error"] = (
                image_pull.pull_failed_message(run.image, pull_error)
                if pull_error
                else image_pull.missing_image_message(run.image)
            )
            settings["missing_image"] = run.image
        else:
            settings.update(self._own_root(request, plan, info, no_root))
        return Sandboxing(settings, hosts_file_text(run.hosts), network_by_path=True)

    @staticmethod
    def _pull(backend: Settings, request: LaunchRequest) -> str | None:
        """Pull the task's missing image with the submitter's registry credential (at the
        start, in this thread: the gang waits for it, at most ``image_pull.PULL_TIMEOUT_S``);
        None when pulled, else why not."""
        image = request.run.image
        assert image is not None
        tls_verify = image_registry(image) not in backend.insecure_registries
        log.info(
            "task %s: pulling image %s with a registry credential of its submitter",
            request.key.task,
            image,
        )
        return image_pull.pull_image(
            image, request.registry_credentials, request.run_dir, tls_verify=tls_verify
        )

    @staticmethod
    def _own_root(
        request: LaunchRequest,
        plan: container.ContainerPlan,
        info: container_image.ImageInfo,
        why_not: str | None,
    ) -> dict[str, Any]:
        """The container's own root for the runner to mount
        (``container_image.root_overlay``; RESTART keeps ``<run_dir>/sandbox``, this layer
        with it) or why not, and what becomes of an image ``USER`` that is not root: said in
        the task log (or a start error)."""
        settings: dict[str, Any] = {}
        ids = None if info.runs_as_root or plan.id_bases is None else container_image.user_ids(info)
        data_ids = None
        if ids is not None and (bases := plan.id_bases) is not None:  # the image's USER, mapped
            plan = dataclasses.replace(plan, user=info.user)
            settings["command_prefix"] = container.podman_argv(plan)
            data_ids = container_image.user_host_ids(ids, bases)
        if plan.rootfs is not None:
            layer = container_image.root_overlay(
                plan, info, request.run_dir / "sandbox" / "overlay" / "image"
            )
            container_image.prepare_rootfs(plan, layer)
            settings["overlays"] = [layer]
            settings["userns"] = container.container_userns(
                plan, container_image.image_links(info), data_ids
            )
        note, settings["start_error"] = container_image.user_note(
            plan.image, info, plan.rootfs is not None, mapped=data_ids is not None
        )
        lines = (container_image.root_note(why_not), note)
        settings["description"] = request.run.sandbox.description + "".join(
            f"\n{line}" for line in lines if line
        )
        return settings


NO_SANDBOX, BUBBLEWRAP, PODMAN = NoSandbox(), Bubblewrap(), Podman()


def strategy_for(podman: bool, bwrap: bool) -> Strategy:
    """The strategy of a task: podman for an image that runs as a container here, else
    bubblewrap where it works, else none."""
    return PODMAN if podman else BUBBLEWRAP if bwrap else NO_SANDBOX
