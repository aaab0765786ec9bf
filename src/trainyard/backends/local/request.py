"""Building the local backend's requests: a gang's ``GroupRequest`` and each task's
``LaunchRequest`` (runner command, sandbox settings, environment, volumes, network), and the
dry run's rendering of them. No side effects but the probes (cached).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from trainyard.backends.base import TaskLaunch, server_url_for_tasks, task_api_env
from trainyard.backends.images import image_note, image_summary, runtime_for, runtime_path
from trainyard.backends.local import container
from trainyard.backends.local.isolation import LaunchRequest, strategy_for
from trainyard.backends.local.launcher import LauncherClient
from trainyard.backends.local.netns import GroupNetwork, probe_egress_attach
from trainyard.backends.local.probe import Isolation, warn_once
from trainyard.backends.local.router import probe_router
from trainyard.backends.local.sandbox import bwrap_end, probe_remap
from trainyard.errors import BackendError
from trainyard.runfile import SandboxSettings, TaskLimits, TaskRun
from trainyard.runner.hosted import DATA_FIELDS, hostable
from trainyard.spec.fields import split_mount
from trainyard.spec.poolfit import ALLOWED_MOUNTS_OPTION

__all__ = [
    "GroupRequest",
    "RequestBuilder",
    "group_key",
    "holds_namespaces",
    "joins_in_launcher",
    "loopback_address",
]


@dataclass(frozen=True)
class GroupRequest:
    """One gang's start on this machine: its launches and the isolation probed for them.

    The per-task ``LaunchRequest`` is built when it is sent, with the GPUs lent and the
    group's network namespace made then; ``render()`` builds each one without those (no
    GPU, no namespace path, no API token) for the dry run.
    """

    launches: list[TaskLaunch]
    iso: Isolation
    preview: Callable[[TaskLaunch], str]

    def render(self) -> str:
        """Each task's runner command, sandbox command prefix and run file, for a person."""
        return "\n".join(self.preview(launch) for launch in self.launches)


def loopback_address(workflow_id: str, task: str) -> str:
    """A stable 127/8 address for a task (never 127.0.0.x, never a .0 or .255 host part)."""
    digest = hashlib.sha256(f"{workflow_id}\0{task}".encode()).digest()
    return f"127.{1 + digest[0] % 254}.{digest[1]}.{1 + digest[2] % 254}"


def group_key(launch: TaskLaunch) -> str:
    """The launcher's name for a task's group (its namespace and lifetime)."""
    return f"{launch.key.workflow_id}/{launch.group}"


def is_within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or below it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@functools.lru_cache(maxsize=1)
def why_no_egress() -> str | None:
    """Why group namespaces get no egress here (``netns.probe_egress_attach``, once per
    process; warns once), or None."""
    why_not = probe_egress_attach()
    if why_not is not None:
        warn_once(
            f"local backend: no egress for tasks ({why_not}); they reach only their "
            "group and the forwarded ports"
        )
    return why_not


def holds_namespaces() -> bool:
    """Whether the launcher holds group namespaces as descriptors (as root, see
    ``backends.local.launcher``), which a hosted runner's thread can join."""
    return os.geteuid() == 0


def joins_in_launcher(launch: TaskLaunch, iso: Isolation) -> bool:
    """Whether ``build_request`` will have the launcher join the task's runner thread to the
    group's namespace (``LaunchRequest.joins_group_network``): ``runner.hosted.hostable``
    (sandboxed, no data to move), read from the launch, as root."""
    moves_data = any(launch.run.get(field) for field in DATA_FIELDS)
    return iso.bwrap and not moves_data and holds_namespaces()


class RequestBuilder:
    """Turns launches into the local backend's requests (a base of ``LocalBackend``: the
    attributes below are set by its ``__init__``)."""

    home: Path
    state_dir: Path
    python: str
    images: dict[str, str]
    allowed_mounts: list[str] | None
    egress: bool
    allow_host_network: bool
    forward_ports: list[int]
    limits: bool
    pids_max: int
    insecure_registries: tuple[str, ...]
    _launcher: LauncherClient

    def _preview(self, launch: TaskLaunch, iso: Isolation) -> str:
        """One task of a dry run: the runner's command, the prefix its command runs under
        and its run file, as ``build_task_request`` makes them without GPUs, the group's
        namespace path or an API token. A podman task's container is only named (its image
        is inspected and its root prepared at start)."""
        key = launch.key
        head = f"# task {key.task} (retry {key.retry_id}) on node {launch.node}"
        if self._podman_for(runtime_for(launch.run.get("image"), self.images)):
            return f"{head}: podman container of image {launch.run.get('image')}"
        request = self.build_task_request(launch, iso, with_token=False)
        run = request.run
        return "\n".join(
            [
                head,
                f"$ {shlex.join(request.argv)}",
                f"# the command runs under: {shlex.join(run.sandbox.command_prefix) or '(nothing)'}",
                f"# {request.run_dir / 'run.json'}:",
                run.model_dump_json(indent=2),
            ]
        )

    def build_task_request(
        self,
        launch: TaskLaunch,
        iso: Isolation,
        net: GroupNetwork | None = None,
        gpus: tuple[int, ...] = (),
        *,
        with_token: bool = True,
    ) -> LaunchRequest:
        """Turn one launch into the command line and runner input (no side effects but
        the probes, which are cached).

        Args:
            gpus: machine-wide indices of the real GPUs lent to the task (``GpuLeases``);
                they become its ``CUDA_VISIBLE_DEVICES`` (empty: none visible).
            with_token: put the task's API URL and token in its environment (not in a dry run).
        """
        run = TaskRun.model_validate(launch.run)
        run_dir = Path(launch.run_dir)
        runtime = runtime_for(run.image, self.images)
        podman = self._podman_for(runtime)
        run.sandbox = SandboxSettings(
            path_prepend=runtime_path(runtime, self.state_dir),
            env=self._task_env(run, iso, gpus, with_token),
            description=self._describe(
                launch,
                iso,
                image_note(run.image, runtime, None if podman else self._why_no_podman()),
            ),
            summary=self._summarize(
                launch,
                iso,
                image_summary(run.image, runtime, None if podman else self._why_no_podman()),
            ),
            limits=self.task_limits(launch),
        )
        request = LaunchRequest(launch.key, run_dir, [], run, run_dir / "sandbox" / "root")
        request.registry_credentials = launch.registry_credentials
        request.writable_dirs = self._writable_dirs(run)
        remap = not (net is not None and net.user_ns and not run.host_network)
        box = strategy_for(podman, iso.bwrap).sandbox(
            self, request, remap=remap, net=net if iso.netns else None, gpus=gpus
        )
        request.hosts_text, request.plan = box.hosts_text, box.plan
        run.sandbox = run.sandbox.model_copy(update=box.settings)
        if not box.network_by_path:
            self._join_network(request, iso, net)
        request.argv = [self.python, "-m", "trainyard.runner", str(run_dir / "run.json")]
        return request

    def _join_network(
        self, request: LaunchRequest, iso: Isolation, net: GroupNetwork | None
    ) -> None:
        """How the task gets into its group's network namespace: none for
        ``hostNetwork``; a hosted runner's thread moved there by the launcher (as root);
        else ``nsenter`` put before the sandbox prefix."""
        run = request.run
        request.hosted = hostable(run)
        if run.host_network:
            return  # the host's network namespace: nothing to join
        if iso.netns and net is None and request.hosted and holds_namespaces():
            request.joins_group_network = True
        elif iso.netns and net is not None:
            prefix = net.join_argv() + run.sandbox.command_prefix
            run.sandbox.command_prefix = prefix
            if run.sandbox.userns is not None:
                run.sandbox.userns = run.sandbox.userns.model_copy(
                    update={"args_at": bwrap_end(prefix)}
                )

    def task_limits(self, launch: TaskLaunch) -> TaskLimits | None:
        """The task's limits from its spec's resources (memory, cpu: a pod's requests as
        limits) and the pool's ``pids_max``; None where the pool says ``limits: false``."""
        if not self.limits:
            return None
        return TaskLimits(
            memory_bytes=launch.resources.memory_bytes,
            cpu=launch.resources.cpu,
            pids_max=self.pids_max,
        )

    def _task_env(
        self, run: TaskRun, iso: Isolation, gpus: tuple[int, ...], with_token: bool = True
    ) -> dict[str, str]:
        env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}
        if with_token:
            env.update(task_api_env(self.home, run.workflow_id))  # URL and a task token
        if iso.netns:
            for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if name not in run.environment:
                    env[name] = "lo"
        return env

    def _summarize(self, launch: TaskLaunch, iso: Isolation, image: str) -> str:
        """The task log's one-line header: node, isolation, what runs (``_describe`` says
        it all, in the detail lines)."""
        runtime = runtime_for(launch.run.get("image"), self.images)
        fs = (
            "podman container"
            if self._podman_for(runtime)
            else "bubblewrap sandbox"
            if iso.bwrap
            else "no sandbox"
        )
        return f"{launch.node}, {fs}, {image}"

    def _describe(self, launch: TaskLaunch, iso: Isolation, image: str = "") -> str:
        runtime = runtime_for(launch.run.get("image"), self.images)
        if self._podman_for(runtime):
            nested = (
                ""
                if container.PODMAN_SECCOMP.is_file()
                else f"; nested user namespaces allowed: no {container.PODMAN_SECCOMP} to "
                "build a seccomp profile from"
            )
            fs = (
                f"podman container of image {launch.run.get('image')} (root inside is the "
                f"host's nobody, no capabilities{nested})"
            )
        else:
            why_not = probe_remap() if iso.bwrap else None
            uid = (
                "root inside is the host's nobody"
                if why_not is None
                else f"root inside is the host's root, secrets covered; no uid remap: {why_not}"
            )
            fs = (
                "bubblewrap sandbox (own writable /, pid/ipc/uts/user namespaces, no "
                f"capabilities, {uid})"
                if iso.bwrap
                else "no sandbox (/tmp and file paths rewritten to a private folder)"
            )
        if launch.run.get("host_network"):
            netw = "the host's network (hostNetwork: true)"
        elif iso.netns:
            netw = f"network namespace of the group, {self._egress_text()}"
        else:
            netw = "host network (loopback addresses)"
        host = loopback_address(launch.key.workflow_id, launch.key.task)
        line = f"local backend on {launch.node}: {fs}; {netw}; address {host}"
        return f"{line}\n{image}" if image else line

    def _egress_on(self) -> bool:
        """Whether group namespaces get egress: the pool allows it and pasta works here
        (probed once per process, ``why_no_egress``)."""
        return self.egress and why_no_egress() is None

    def _egress_text(self) -> str:
        if not self.egress:
            return "no egress (pool egress: false)"
        why_not = why_no_egress()
        if why_not is not None:
            return f"no egress ({why_not})"
        no_router = probe_router()
        if no_router is None:
            return (
                "egress through pasta behind the launcher's egress router (a veth to it, "
                "no route to other groups)"
            )
        return f"egress through pasta of its own (no egress router: {no_router})"

    def _check_host_network(self, launches: list[TaskLaunch]) -> None:
        """A task asking ``hostNetwork: true`` on a pool that does not allow it is refused
        (the submission check refuses it first; this guards specs stored before)."""
        asked = [launch.key.task for launch in launches if launch.run.get("host_network")]
        if asked and not self.allow_host_network:
            raise BackendError(
                f"task(s) {', '.join(asked)} ask hostNetwork: true, which this "
                "pool does not allow (allow_host_network: true in pools.yaml)"
            )

    def _needs_group_network(self, launches: list[TaskLaunch], iso: Isolation) -> bool:
        """Whether some task joins the group's namespace by its path (``nsenter``, podman's
        ``--network ns:``) rather than in the launcher or not at all (``hostNetwork``)."""
        if not iso.netns:
            return False
        return any(
            not launch.run.get("host_network")
            and (
                self._podman_for(runtime_for(launch.run.get("image"), self.images))
                or not joins_in_launcher(launch, iso)
            )
            for launch in launches
        )

    def _why_no_podman(self) -> str | None:
        return container.probe_podman()

    def _podman_for(self, runtime: str) -> bool:
        """Whether a task of this image runtime runs as a podman container here."""
        return runtime == container.RUNTIME and self._why_no_podman() is None

    def _writable_dirs(self, run: TaskRun) -> list[Path]:
        dirs = [Path(run.run_dir), run.output_path]
        dirs += [run.input_path(i) for i in range(len(run.inputs))]
        if run.barrier.enabled and run.barrier.folder:
            dirs.append(Path(run.barrier.folder))
        return dirs

    def volumes(self, run: TaskRun) -> tuple[tuple[str, str], ...]:
        """``(host folder, path inside)`` of each ``volumeMounts`` entry, checked again
        against the pool's ``allowed_mounts`` (a backend made without a pool trusts the spec
        layer's check).

        Raises:
            BackendError: a mount the pool does not allow, or one onto ``/``, ``/proc``,
                ``/dev`` or ``/sys``.
        """
        found = []
        for value in run.volume_mounts:
            host, inside = split_mount(value)
            allowed = self.allowed_mounts
            if allowed is not None and not any(is_within(host, a) for a in allowed):
                raise BackendError(
                    f"volume mount {value!r}: {host} is not in the pool's "
                    f"options.{ALLOWED_MOUNTS_OPTION} ({', '.join(allowed) or 'none'})"
                )
            if inside == "/" or any(is_within(inside, f"/{t}") for t in ("proc", "dev", "sys")):
                raise BackendError(
                    f"volume mount {value!r}: cannot mount onto {inside}; "
                    "choose a path such as /mnt/NAME"
                )
            found.append((host, inside))
        return tuple(found)

    def _server_url(self) -> str | None:
        return server_url_for_tasks(self.home)

    def _forwarded_ports(self) -> list[int]:
        ports = list(self.forward_ports)
        server = self._server_url()
        if server:
            parsed = urlparse(server)
            if parsed.hostname in ("127.0.0.1", "localhost") and parsed.port:
                ports.append(parsed.port)
        return sorted(set(ports))

    def _group_network(self, launch: TaskLaunch) -> GroupNetwork:
        return self._launcher.network(group_key(launch), self._forwarded_ports(), self._egress_on())
