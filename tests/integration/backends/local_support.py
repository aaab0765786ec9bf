"""Helpers for local backend tests: launches, waiting for facts, finding processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from trainyard.backends.base import FactKind, TaskFact, TaskKey, TaskLaunch
from trainyard.backends.local import LocalBackend, probe_isolation
from trainyard.backends.local.container_image import image_present

FINAL = (FactKind.EXITED, FactKind.LOST, FactKind.START_ERROR)


def group_launches(
    backend: LocalBackend,
    home: Path,
    workflow_id: str,
    tasks: dict[str, dict[str, Any]],
    *,
    group: str = "g",
    retry_id: int = 0,
    barrier: bool = False,
    **launch_fields: Any,
) -> list[TaskLaunch]:
    """One launch per task of a gang; each task's dict holds TaskRun fields (command...)."""
    names = list(tasks)
    hosts = {n: backend.host_of(TaskKey(workflow_id, n, retry_id), "local-0") for n in names}
    rdv = home / "runs" / workflow_id / "_barrier" / group / str(retry_id)
    launches = []
    for index, (name, fields) in enumerate(tasks.items()):
        run_dir = home / "runs" / workflow_id / name / str(retry_id)
        run = {
            "workflow_id": workflow_id,
            "group": group,
            "task": name,
            "retry_id": retry_id,
            "lead": index == 0,
            "lead_task": names[0],
            "hosts": hosts,
            "group_tasks": names,
            "task_index": index,
            "run_dir": str(run_dir),
            "barrier": {"enabled": barrier, "folder": str(rdv), "tasks": names},
            **fields,
        }
        launches.append(
            TaskLaunch(
                key=TaskKey(workflow_id, name, retry_id),
                group=group,
                node="local-0",
                run_dir=run_dir,
                run=run,
                **launch_fields,
            )
        )
    return launches


def wait_final(
    backend: LocalBackend, keys: list[TaskKey], timeout_s: float = 60
) -> dict[TaskKey, list[TaskFact]]:
    """Poll until every key has a final fact; returns every fact seen per key."""
    seen: dict[TaskKey, list[TaskFact]] = {k: [] for k in keys}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for fact in backend.poll():
            seen.setdefault(fact.key, []).append(fact)
        if all(any(f.kind in FINAL for f in seen[k]) for k in keys):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"no final fact in {timeout_s}s: {seen}")


_SEEN: dict[int, list[TaskFact]] = {}


def wait_for(
    backend: LocalBackend,
    key: TaskKey,
    kind: FactKind,
    timeout_s: float = 30,
    *,
    earlier: bool = False,
) -> list[TaskFact]:
    """Poll until ``key`` reports ``kind``; returns the facts seen for ``key``.
    With ``earlier``, facts an earlier ``wait_for`` on this backend polled count too."""
    seen = _SEEN.setdefault(id(backend), [])
    facts = [f for f in seen if f.key == key] if earlier else []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        polled = backend.poll()
        seen += polled
        facts += [f for f in polled if f.key == key]
        if any(f.kind is kind for f in facts):
            return facts
        time.sleep(0.05)
    raise AssertionError(f"{key} did not report {kind} in {timeout_s}s: {facts}")


def final(facts: list[TaskFact]) -> TaskFact:
    return next(f for f in facts if f.kind in FINAL)


def task_log(launch: TaskLaunch) -> str:
    return (launch.run_dir / "task.log").read_text()


def processes_with(marker: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose command line contains ``marker``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if marker in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def wait_gone(marker: str, timeout_s: float = 15) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def isolation_available(sandbox: str, network: str) -> str | None:
    """None when this machine supports the mode, else why not."""
    try:
        probe_isolation(sandbox, network)
    except Exception as exc:  # BackendError: asked-for isolation fails here
        return str(exc)
    return None


BUSYBOX_IMAGE = "localhost/trainyard-test-busybox:2"  # :2 adds the applets of the privileges test
BUSYBOX_APPLETS = (
    "sh",
    "ls",
    "cat",
    "echo",
    "nc",
    "sleep",
    "test",
    "hostname",
    "env",
    "true",
    "grep",
    "id",
    "mount",
    "unshare",
    "touch",
    "chown",
    "mkdir",
    "stat",
)


def _static_busybox() -> str | None:
    """A statically linked busybox (no ELF interpreter named in its first page)."""
    for path in ("/bin/busybox", shutil.which("busybox") or ""):
        if path and os.path.isfile(path):
            with open(path, "rb") as handle:
                if b"ld-linux" not in handle.read(4096):
                    return path
    return None


def busybox_image(folder: Path) -> str:
    """A tiny image for podman tests (no registry is reachable here): Debian's static busybox
    as ``/bin/busybox`` with applet links in an otherwise empty file system, imported with
    ``podman import`` once (an earlier run's is used as it is). Skips without a static
    busybox (Debian busybox-static)."""
    if image_present(BUSYBOX_IMAGE):
        return BUSYBOX_IMAGE
    busybox = _static_busybox()
    if busybox is None:
        pytest.skip("a static busybox (Debian busybox-static) is not installed")
    tarball = folder / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    done = subprocess.run(
        ["podman", "import", "--change", 'CMD ["/bin/sh"]', str(tarball), BUSYBOX_IMAGE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return BUSYBOX_IMAGE
