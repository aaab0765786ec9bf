"""The local backend's task sandbox: the bubblewrap (``bwrap``) arguments that give a task what
a container gives it in OSMO and nothing of the host or of trainyard beyond that
(``bwrap_argv``), the mounts the runner writes through (``sandbox_mounts``), what the task
owns (``task_owned``), and the probes. Its parts: ``sandboxplan`` (vocabulary, plan),
``layers`` (private system layers), ``accounts``, ``hostscan`` (what stays hidden). Layout
and reasons: docs/local-backend.md "The task sandbox".
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from trainyard.backends.local.accounts import account_entries, scrub_passwords
from trainyard.backends.local.hostscan import _cover_args, _secret_args, secret_covers
from trainyard.backends.local.layers import (
    OPAQUE_XATTR,
    SKELETON_BASE,
    _idmapped,
    _idmapped_layer,
    fresh_layer,
    fresh_paths,
    idmapped_covers,
    overlays,
    skeleton_base,
    system_skeleton,
    warm_host_scans,
)
from trainyard.backends.local.sandboxplan import (
    _HANDLED_APART,
    _PRIVATE_TOP,
    ACCOUNTS,
    FRESH,
    GPU_DEVICES,
    IDMAPPED,
    OSMO_WORKSPACE,
    PRIVATE_DIRS,
    PRIVILEGE_ARGS,
    PWD_LOCK,
    READ_ONLY_TOP,
    REMAP_ARGS,
    SKELETON,
    SYSTEM_TOP,
    TASK_HOST_UID,
    SandboxPlan,
    _has_symlink,
    _layer_dir,
    _overlaid,
    _system_tops,
    _top,
    _under,
    needs_bind,
)

__all__ = [
    "SandboxPlan",
    "bwrap_argv",
    "sandbox_mounts",
    "needs_bind",
    "probe_bwrap",
    "READ_ONLY_TOP",
    "SYSTEM_TOP",
    "PRIVILEGE_ARGS",
    "hosts_file_text",
    "overlays",
    "clear_links",
    "overlay_supported",
    "secret_covers",
    "REMAP_ARGS",
    "TASK_HOST_UID",
    "bwrap_end",
    "task_owned",
    "probe_remap",
    "OSMO_WORKSPACE",
    "IDMAPPED",
    "idmapped_covers",
    "warm_host_scans",
    "FRESH",
    "SKELETON",
    "system_skeleton",
    "fresh_paths",
    "skeleton_base",
    "SKELETON_BASE",
    "fresh_layer",
    "OPAQUE_XATTR",
    "ACCOUNTS",
    "PWD_LOCK",
    "account_entries",
    "scrub_passwords",
    "gpu_device_nodes",
]


def _top_level_args(plan: SandboxPlan) -> list[str]:
    """The host's system folders; a symlink already in ``root_dir`` (an earlier start of the
    same sandbox) is kept, as bwrap refuses to make it again."""
    args: list[str] = []
    overlaid = _overlaid(plan)
    for entry in _system_tops(plan.host_root):
        target = f"/{entry.name}"
        if entry.link is not None:
            link = entry.link
            if not _has_symlink(plan.root_dir / entry.name, link):
                args += ["--symlink", link, target]
        elif entry.name in overlaid:
            assert plan.overlay_dir is not None
            args += ["--bind", str(_layer_dir(plan, entry.name, "mnt")), target]
        elif entry.empty:
            args += ["--dir", target]  # nothing to show: a folder of the sandbox's own
        else:
            args += ["--ro-bind", entry.path, target]
    for private in PRIVATE_DIRS:
        args += ["--dir", private]
    return args  # top-level files (/.dockerenv) belong to the host's image, not the task's


def _system_args(host_root: Path) -> list[str]:
    """A minimal ``/dev`` (null, zero, random, tty, pts, shm) with the host's GPU device
    nodes; the task's own ``/proc`` with ``/proc/sys`` read-only (the task is uid 0 of the
    host for permission checks: sysctls would be writable); ``/sys`` read-only."""
    args = ["--dev", "/dev"]
    for node in gpu_device_nodes():
        args += ["--dev-bind", node, node]
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    if (host_root / "sys").is_dir():
        args += ["--ro-bind", "/sys", "/sys"]
    return args


@functools.lru_cache(maxsize=4)
def gpu_device_nodes(dev: Path = Path("/dev")) -> tuple[str, ...]:
    """The host's GPU device nodes and folders (``GPU_DEVICES``), sorted; asked once per
    process (a driver loaded later needs a new backend process)."""
    found: set[str] = set()
    for pattern in GPU_DEVICES:
        found.update(str(p) for p in dev.glob(pattern))
    return tuple(sorted(found))


def _same_path_binds(plan: SandboxPlan) -> list[tuple[str, str, str]]:
    """(flag, host path, path inside) of the same-path binds, parents before children. A
    private top-level folder itself (``/tmp``) is never bound: that would hand the task the
    host's."""
    binds = [(real, "--ro-bind") for real in _realpaths(plan.readonly)]
    binds += [(os.path.realpath(p), "--bind") for p in plan.writable]
    out: list[tuple[str, str, str]] = []
    done: list[tuple[str, str]] = []
    for real, flag in sorted(set(binds), key=lambda b: (len(Path(b[0]).parts), b[0])):
        if any(flag == f and _under(real, d) for d, f in done):
            continue  # a folder already bound the same way shows it (bwrap's cost grows
            # with every mount: it reads /proc/self/mountinfo for each)
        if len(Path(real).parts) > 2 or _top(real) not in _PRIVATE_TOP | _HANDLED_APART:
            out.append((flag, real, real))
            done.append((real, flag))
    return out


@functools.lru_cache(maxsize=16)
def _realpaths(paths: tuple[str, ...]) -> tuple[str, ...]:
    """``os.path.realpath`` of each of ``paths``: the read-only binds (trainyard's
    interpreter and import path), the same for every task, resolved once per process."""
    return tuple(os.path.realpath(p) for p in paths)


def _binds(plan: SandboxPlan) -> list[tuple[str, str, str]]:
    """Every bind after the top-level ones: same-path binds, then the volumes. Remembered
    for the last few plans (asked four times per task start, a realpath per path)."""
    return list(_binds_of(plan))


@functools.lru_cache(maxsize=16)
def _binds_of(plan: SandboxPlan) -> tuple[tuple[str, str, str], ...]:
    volumes = [("--bind", host, inside) for host, inside in plan.volumes]
    return tuple(_same_path_binds(plan) + sorted(volumes, key=lambda b: len(Path(b[2]).parts)))


def bwrap_argv(plan: SandboxPlan, bwrap: str = "bwrap") -> list[str]:
    """The ``bwrap ... --`` prefix that runs a program in the sandbox of ``plan``."""
    args = [bwrap, "--bind", str(plan.root_dir), "/"]
    args += _top_level_args(plan)
    args += _system_args(plan.host_root)
    if plan.host_uid is None:
        args += _secret_args(plan.host_root)
    else:
        args += _cover_args(idmapped_covers(plan))
    for path in _covered(plan):  # before the binds: a task's output may be under it
        args += ["--tmpfs", path]
    if plan.host_uid is not None:
        args += _reachable_parents(plan)
    for flag, host, inside in _binds(plan):
        args += [flag, host, inside]
    if plan.hosts_file is not None:
        args += ["--ro-bind", str(plan.hosts_file), "/etc/hosts"]
    privileges = PRIVILEGE_ARGS if plan.host_uid is None else REMAP_ARGS
    args += [
        *privileges,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        plan.hostname,
    ]
    return [*args, "--die-with-parent", "--chdir", "/", "--"]


def _reachable_parents(plan: SandboxPlan) -> list[str]:
    """``--perms 0755 --dir P`` for every folder above a bind's destination: bwrap makes
    missing ones with mode 0700 as the host's root, which a task whose uid 0 is not the
    host's could not pass (``/root/.pyenv`` above the interpreter, ``/tmp/...`` above its
    output folder, ``/mnt`` above a volume). Existing folders keep their mode."""
    tops = {f"/{e.name}" for e in _system_tops(plan.host_root)}
    parents: set[str] = set()
    for _flag, _host, inside in _binds(plan):
        parent = os.path.dirname(inside.rstrip("/"))
        while parent not in ("/", "") and parent not in tops:
            parents.add(parent)
            parent = os.path.dirname(parent)
    args: list[str] = []
    for parent in sorted(parents, key=lambda p: (len(Path(p).parts), p)):
        args += ["--perms", "0755", "--dir", parent]
    return args


def bwrap_end(prefix: list[str]) -> int:
    """The index of bwrap's ``--`` in a prefix made with ``bwrap_argv`` (after an optional
    ``nsenter ... --``): where ``--info-fd`` and ``--userns-block-fd`` go."""
    ends = [i for i, arg in enumerate(prefix) if arg == "--"]
    start = next((i for i, arg in enumerate(prefix) if os.path.basename(arg) == "bwrap"), 0)
    return next(i for i in ends if i > start)


def task_owned(plan: SandboxPlan) -> tuple[list[str], list[str]]:
    """With ``host_uid``: the host folders the runner gives to the task before it starts
    (its root, ``/tmp``, its private folders, the top of each system folder's private
    layer and of each idmapped layer) and those whose every folder below it also gives
    (``/usr/local``, only where ``/usr`` is not idmapped: an idmapped ``/usr`` already shows
    root's folders as the task's, and giving each folder would copy every one of them up)."""
    own = [
        str(plan.root_dir),
        str(plan.root_dir / "tmp"),
        *(str(plan.root_dir / d.lstrip("/")) for d in PRIVATE_DIRS),
    ]
    below: list[str] = []
    idmapped = _idmapped(plan)
    for name in sorted(_overlaid(plan)):
        view = str(_layer_dir(plan, name, "mnt"))
        own.append(view)
        if name == "usr" and "usr" not in idmapped:
            # without the idmapped /usr, pip's /usr/local is given folder by folder: every
            # folder is copied up into the task's layer (hundreds where CUDA lives there)
            own.append(os.path.join(view, "local"))
            below.append(os.path.join(view, "local"))
    # an idmapped layer's top folder is its upper folder (made by the runner as root)
    own += [
        layer.target
        for layer in map(functools.partial(_idmapped_layer, plan), _idmapped(plan))
        if layer.target not in own
    ]
    return own, below


def _covered(plan: SandboxPlan) -> list[str]:
    """The ``hidden`` folders that a shown system folder holds (those to cover)."""
    shown = {e.name for e in _system_tops(plan.host_root) if e.link is None and not e.empty}
    return [
        real
        for real in (os.path.realpath(p) for p in plan.hidden)
        if _top(real) in shown and len(Path(real).parts) > 2
    ]


def clear_links(plan: SandboxPlan) -> list[str]:
    """Remove the symlinks (and files) a task left where bwrap will make a mount point or
    folder: in ``root_dir``, or in a system folder's private layer (``upper``). bwrap makes
    them as root before the task's view exists and would follow a link there to the host
    (``ln -s /etc /root`` then a bind at ``/root/.pyenv``). Call before each start.

    Returns:
        the paths inside the sandbox that were removed.
    """
    if not os.path.lexists(plan.root_dir) and (
        plan.overlay_dir is None or not os.path.lexists(plan.overlay_dir)
    ):
        return []  # a fresh sandbox (not a RESTART in place): nothing a task left
    removed: list[str] = []
    overlaid = _overlaid(plan)
    inside = [f"/{e.name}" for e in _system_tops(plan.host_root) if e.link is None]
    secrets = secret_covers(plan.host_root)
    files = {"/etc/hosts", *(p for p, is_dir in secrets if not is_dir)}
    inside += [*PRIVATE_DIRS, "/tmp", "/etc/hosts", *(b[2] for b in _binds(plan))]
    inside += [p for p, _is_dir in secrets]
    covers = idmapped_covers(plan)
    files |= {p for p, is_dir in covers if not is_dir}
    inside += [p for p, _is_dir in covers]
    idmapped = {f"/{rel}": Path(_idmapped_layer(plan, rel).upper) for rel in _idmapped(plan)}
    for path in inside:
        parts = Path(path).parts[1:]
        base = plan.root_dir
        own = next((f for f in sorted(idmapped, key=len, reverse=True) if _under(path, f)), None)
        if own is not None:
            base, parts = idmapped[own], Path(path).parts[len(Path(own).parts) :]
        elif parts and parts[0] in overlaid and plan.overlay_dir is not None:
            base, parts = _layer_dir(plan, parts[0], "upper"), parts[1:]
        gone = _clear_on_the_way(base, parts, last_may_be_file=path in files)
        if gone is not None:
            removed.append(path)
    return removed


def _clear_on_the_way(base: Path, parts: tuple[str, ...], last_may_be_file: bool) -> Path | None:
    """Unlink the first symlink (or misplaced file) on ``base/parts``; returns it if any."""
    place = base
    for index, part in enumerate(parts):
        place = place / part
        is_last = index == len(parts) - 1
        if place.is_symlink() or (
            place.exists() and not place.is_dir() and not (is_last and last_may_be_file)
        ):
            place.unlink()
            return place
        if not place.exists():
            return None
    return None


def sandbox_mounts(plan: SandboxPlan) -> tuple[dict[str, str], list[str]]:
    """What the sandbox of ``plan`` shows where, for a process outside it (the runner, once
    the ``overlays`` are mounted).

    Returns:
        ``{path inside: host path}`` (``/`` is the root folder; a system folder is its
        overlay's merged view or the host's; a top-level symlink is what it points to; the
        binds are themselves) and the entries bound read-only. Feeds
        ``SandboxSettings.mounts`` and ``readonly``.
    """
    mounts = {"/": str(plan.root_dir)}
    readonly: set[str] = set()
    overlaid = _overlaid(plan)
    for entry in _system_tops(plan.host_root):
        name = entry.name
        if entry.link is not None or entry.empty and name not in overlaid:
            continue  # links are followed below; empty folders are the sandbox's own
        if name in overlaid:
            assert plan.overlay_dir is not None
            mounts[f"/{name}"] = str(_layer_dir(plan, name, "mnt"))
        else:
            mounts[f"/{name}"] = entry.path
            readonly.add(f"/{name}")
    for entry in _system_tops(plan.host_root):
        if entry.link is not None:
            _add_link(mounts, readonly, f"/{entry.name}", entry.link)
    for flag, host, inside in _binds(plan):
        mounts[inside] = host
        (readonly.add if flag == "--ro-bind" else readonly.discard)(inside)
    return mounts, sorted(readonly)


def _add_link(mounts: dict[str, str], readonly: set[str], link: str, target: str) -> None:
    """``/bin -> usr/bin``: ``/bin`` maps where ``/usr/bin`` does."""
    resolved = os.path.normpath(os.path.join("/", target))
    top = f"/{_top(resolved)}"
    if top in mounts:
        rest = resolved[len(top) :].lstrip("/")
        mounts[link] = f"{mounts[top].rstrip('/')}/{rest}" if rest else mounts[top]
        if top in readonly:
            readonly.add(link)


@functools.lru_cache(maxsize=1)
def overlay_supported() -> bool:
    """Whether the runner can mount the private writable layers here: as root (it mounts in
    the init user namespace) with overlayfs in ``/proc/filesystems``. Asked once."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/filesystems", encoding="utf-8") as handle:
            return any(line.split()[-1:] == ["overlay"] for line in handle)
    except OSError:
        return False


def hosts_file_text(hosts: dict[str, str]) -> str:
    """``/etc/hosts`` for a task: localhost plus one line per task of its group, each IPv4
    address also in its IPv4-mapped IPv6 form (``::ffff:10.0.0.2``).

    Why the mapped lines: a dual-stack server (torch's TCPStore listens on ``::``) sees an
    IPv4 peer as ``::ffff:a.b.c.d`` and torch names every accepted peer with
    ``getnameinfo`` (c10d ``socket.cpp``, ``formatSockAddr``, no ``NI_NUMERICHOST``). glibc's
    ``files`` source does not map that form back to the IPv4 line, so without these lines
    each rendezvous connection asked DNS for a PTR record, and one unanswered query held the
    store's single thread for the resolver's timeout (10 s: ``resolv.conf(5)``, timeout 5 x
    attempts 2) while the whole gang waited.

    Args:
        hosts: task name -> IPv4 or IPv6 address of each task of the group.

    Returns:
        The file's text, one ``ADDRESS<TAB>NAME`` line per address.
    """
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "::ffff:127.0.0.1\tlocalhost",
    ]
    for name, address in sorted(hosts.items()):
        lines.append(f"{address}\t{name}")
        if ":" not in address:
            lines.append(f"::ffff:{address}\t{name}")
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=1)
def probe_remap(bwrap: str = "bwrap") -> str | None:
    """Whether the task's uid 0 can be mapped to ``TASK_HOST_UID`` here (``REMAP_ARGS``):
    as root; runs ``id -u`` through a real handshake (``linux.userns``, bwrap started as
    ``TASK_HOST_UID``) once per process. Returns None if it works, else why not."""
    if os.geteuid() != 0:
        return "the server does not run as root (bwrap maps uid 0 to its own user)"
    from trainyard.linux.userns import Handshake
    from trainyard.runfile import UserNamespace

    argv = [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        *REMAP_ARGS,
        "--unshare-pid",
        "--",
        "sh",
        "-c",
        "id -u; cat /proc/self/uid_map",
    ]
    shake = Handshake(
        UserNamespace(host_uid=TASK_HOST_UID, host_gid=TASK_HOST_UID, args_at=argv.index("--"))
    )
    try:
        proc = shake.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        shake.started()
        shake.close()
        return str(exc)
    shake.started()
    try:
        shake.finish(timeout_s=15)
        out, _ = proc.communicate(timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        proc.kill()
        proc.wait()
        shake.close()
        return f"the user namespace handshake failed: {exc}"
    lines = out.decode(errors="replace").split()
    if proc.returncode != 0 or lines[:3] != ["0", "0", str(TASK_HOST_UID)]:
        return f"the remapped sandbox said {out.decode(errors='replace').strip()!r}"
    return None


def probe_bwrap(prefix: list[str] | None = None, bwrap: str = "bwrap") -> str | None:
    """Run ``true`` in a minimal sandbox (after ``prefix``, e.g. an ``nsenter`` prefix).
    Returns None if bubblewrap works here, else why not."""
    if shutil.which(bwrap) is None:
        return f"{bwrap} is not installed"
    argv = [
        *(prefix or []),
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--dev-bind",
        "/dev",
        "/dev",
        "--proc",
        "/proc",
        *PRIVILEGE_ARGS,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--",
        "true",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()
