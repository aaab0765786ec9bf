"""A task's own control group: the memory, process-count and CPU limits a container gets.

Works on cgroup v2 (``/sys/fs/cgroup/cgroup.controllers``) and on v1, the hybrid layout
included (v1 controllers under ``/sys/fs/cgroup/<controller>``, a v2 mount beside them at
``unified`` holding none of memory, pids, cpu). Each task gets ``trainyard/<name>`` under
each controller's top (v1) or under the unified top (v2). Over its memory limit the kernel's
OOM killer kills in that group only; ``oom_kills`` tells the runner so (kernel docs:
``admin-guide/cgroup-v2.rst`` memory.events, ``cgroup-v1/memory.rst`` memory.oom_control).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.runfile import TaskLimits

__all__ = ["TaskCgroup", "CgroupUnavailable", "cgroup_root"]

CGROUP_FS = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
"""The CFS period for a CPU quota (the kernel's default period, 100 ms)."""


class CgroupUnavailable(OSError):
    """No control group could be made or set here (the message says which file refused)."""


def cgroup_root(fs: Path = CGROUP_FS) -> tuple[str, Path]:
    """``("v2", top)`` or ``("v1", fs)``: where task groups go.

    Raises:
        CgroupUnavailable: neither layout has the memory controller.
    """
    if (fs / "cgroup.controllers").exists():
        return "v2", fs
    if (fs / "memory" / "memory.limit_in_bytes").exists():
        return "v1", fs
    raise CgroupUnavailable(errno.ENOENT, f"no memory controller under {fs}")


@dataclass
class TaskCgroup:
    """The group(s) of one task attempt; ``create`` makes them, ``remove`` takes them away.

    Args:
        name: a name unique to the attempt (folder-safe).
        limits: what to set; 0 in a field sets no limit for it.
        fs: the cgroup file system's top (tests may point elsewhere).
    """

    name: str
    limits: TaskLimits
    fs: Path = CGROUP_FS
    version: str = ""
    folders: list[Path] = field(default_factory=list)

    def create(self) -> None:
        """Make the group(s) and write the limits.

        Raises:
            CgroupUnavailable: the kernel refused a folder or a limit (nothing is left).
        """
        self.version, top = cgroup_root(self.fs)
        try:
            if self.version == "v2":
                self._create_v2(top)
            else:
                self._create_v1(top)
        except OSError as exc:
            self.remove()
            raise CgroupUnavailable(
                exc.errno or errno.EIO, f"cannot set the task's limits: {exc}"
            ) from exc

    def _create_v2(self, top: Path) -> None:
        wanted = {"memory", "pids", "cpu"}
        parent = top / "trainyard"
        _enable(top, wanted)
        parent.mkdir(exist_ok=True)
        _enable(parent, wanted)
        folder = self._make(parent / self.name)
        limits = self.limits
        if limits.memory_bytes:
            _write(folder / "memory.max", str(limits.memory_bytes))
            _write_if_there(folder / "memory.swap.max", "0")
        if limits.pids_max:
            _write(folder / "pids.max", str(limits.pids_max))
        if limits.cpu:
            _write(folder / "cpu.max", f"{_quota_us(limits.cpu)} {CPU_PERIOD_US}")

    def _create_v1(self, fs: Path) -> None:
        limits = self.limits
        memory = self._make(fs / "memory" / "trainyard" / self.name)
        if limits.memory_bytes:
            _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            _write_if_there(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if limits.pids_max and (fs / "pids").is_dir():
            pids = self._make(fs / "pids" / "trainyard" / self.name)
            _write(pids / "pids.max", str(limits.pids_max))
        if limits.cpu and (fs / "cpu").is_dir():
            cpu = self._make(fs / "cpu" / "trainyard" / self.name)
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(_quota_us(limits.cpu)))

    def _make(self, folder: Path) -> Path:
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir()
        except FileExistsError:  # an attempt's leftover of the same name (a killed runner)
            pass
        self.folders.append(folder)
        return folder

    def add(self, pid: int) -> None:
        """Move process ``pid`` into every group of the task (its later children follow).

        Raises:
            CgroupUnavailable: the kernel refused (the process may be gone).
        """
        for folder in self.folders:
            try:
                _write(folder / "cgroup.procs", str(pid))
            except OSError as exc:
                raise CgroupUnavailable(
                    exc.errno or errno.EIO, f"cannot move process {pid} into {folder}: {exc}"
                ) from exc

    def oom_kills(self) -> int:
        """How many processes the OOM killer killed in the task's memory group."""
        for folder in self.folders:
            for name in ("memory.events", "memory.oom_control"):
                counts = _counts(folder / name)
                if "oom_kill" in counts:
                    return counts["oom_kill"]
        return 0

    def remove(self) -> None:
        """Remove the groups (each must hold no process: call once the command ended and
        its leftovers are killed). A group that is still busy is left, never an error."""
        for folder in reversed(self.folders):
            try:
                folder.rmdir()
            except OSError:
                pass
        self.folders.clear()


def _quota_us(cpu: float) -> int:
    return max(1000, int(round(cpu * CPU_PERIOD_US)))


def _enable(folder: Path, controllers: set[str]) -> None:
    available = set((folder / "cgroup.controllers").read_text().split())
    missing = controllers - available
    if "memory" in missing:
        raise CgroupUnavailable(errno.ENOENT, f"{folder}: no memory controller")
    enabled = set((folder / "cgroup.subtree_control").read_text().split())
    todo = (controllers & available) - enabled
    if todo:
        _write(folder / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(todo)))


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _write_if_there(path: Path, text: str) -> None:
    """A limit the kernel may not offer (swap accounting off): set where it exists."""
    if path.exists():
        _write(path, text)


def _counts(path: Path) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    counts: dict[str, int] = {}
    for line in lines:
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            counts[key] = int(value)
    return counts
