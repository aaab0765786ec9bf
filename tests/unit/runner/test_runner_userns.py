"""The runner's side of the task's user namespace (``linux.userns``): where the handshake's
descriptors go, and giving folders to the task's host uid without following links."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trainyard.linux.userns import give_to_task, give_tree, insert_fds


def test_the_descriptors_go_before_bwraps_end() -> None:
    argv = ["nsenter", "--net=/x", "--", "bwrap", "--bind", "/r", "/", "--", "setpriv", "--", "sh"]
    assert insert_fds(argv, 7, 5, 6) == [
        *argv[:7],
        "--info-fd",
        "5",
        "--userns-block-fd",
        "6",
        *argv[7:],
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_folders_are_given_following_no_link(tmp_path: Path) -> None:
    root = tmp_path / "root"
    give_to_task([str(root), str(root / "tmp")], 65534, 65534)
    assert (root.stat().st_uid, (root / "tmp").stat().st_mode & 0o7777) == (65534, 0o1777)
    victim = tmp_path / "victim"
    victim.mkdir()
    (root / "home").symlink_to(victim)
    with pytest.raises(OSError):
        give_to_task([str(root / "home")], 65534, 65534)
    assert victim.stat().st_uid == 0
    (root / "tmp" / "a").mkdir()
    (root / "tmp" / "a" / "f").write_text("x")
    (root / "tmp" / "link").symlink_to(victim)
    give_tree(str(root / "tmp"), 65534, 65534, files=False)
    assert (root / "tmp" / "a").stat().st_uid == 65534
    assert (root / "tmp" / "a" / "f").stat().st_uid == 0  # folders only
    assert victim.stat().st_uid == 0  # the link itself is not followed


def test_a_bwrap_that_ends_before_the_handshake_is_a_start_error(tmp_path: Path) -> None:
    from trainyard.runfile import UserNamespace
    from trainyard.runner.command import CommandProcess

    lines: list[str] = []
    argv = ["nsenter", "--", "sh", "-c", "exit 1", "--"]  # not bwrap: no child, ends
    proc = CommandProcess(
        argv,
        {"PATH": os.defpath},
        str(tmp_path),
        lambda text, _cut: lines.append(text),
        userns=UserNamespace(host_uid=65534, host_gid=65534, args_at=5),
    )
    with pytest.raises(OSError, match="before its user namespace"):
        proc.start()


@pytest.mark.parametrize("thread_switch", [True, False], ids=["thread-ids", "nsenter"])
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="the remap needs root (it writes another uid's map) and bubblewrap",
)
def test_bwrap_runs_as_the_tasks_host_uid_and_its_command_keeps_no_capability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thread_switch: bool
) -> None:
    """bwrap itself is never the host's root (it was, with setpriv after its ``--``): from
    the host, its process is ``host_uid`` with no supplementary group; inside, the command is
    uid 0 with no capability in any set and cannot make a user namespace. The same whether
    the starting thread switched its own ids or an ``nsenter`` did; the caller is root again
    after, with its groups."""
    from trainyard.backends.local.sandbox import REMAP_ARGS
    from trainyard.linux import thread_ids
    from trainyard.linux.userns import Handshake
    from trainyard.runfile import UserNamespace

    if not thread_switch:
        monkeypatch.setattr(thread_ids, "available", lambda: False)
    groups_before = os.getgroups()
    tmp_path.chmod(0o700)  # the run folder bwrap used to start in: closed to the task's uid
    script = (
        "grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status; "
        "cat /proc/sys/user/max_user_namespaces; read _line"
    )
    argv = [
        "bwrap",
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
        script,
    ]
    shake = Handshake(UserNamespace(host_uid=65534, host_gid=65534, args_at=argv.index("--")))
    proc = shake.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(tmp_path))
    shake.started()
    assert (os.getresuid(), os.getresgid(), os.getgroups()) == ((0, 0, 0), (0, 0, 0), groups_before)
    shake.finish(timeout_s=15)
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()  # bwrap, seen from the host
        ids = {
            line.split(":")[0]: line.split()[1:]
            for line in status.splitlines()
            if line.startswith(("Uid:", "Gid:", "Groups:"))
        }
        assert ids == {"Uid": ["65534"] * 4, "Gid": ["65534"] * 4, "Groups": []}
    finally:
        out, _ = proc.communicate(b"\n", timeout=15)
    inside = dict(line.split(":\t") for line in out.decode().splitlines() if ":\t" in line)
    assert inside["Uid"].split() == ["0"] * 4 and inside["Gid"].split() == ["0"] * 4
    assert {inside[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {
        "0000000000000000"
    }
    assert out.decode().splitlines()[-1] == "0"  # no nested user namespaces
    assert proc.returncode == 0


def test_only_bwrap_or_nsenter_is_started_as_the_tasks_uid() -> None:
    from trainyard.linux.userns import Handshake
    from trainyard.runfile import UserNamespace

    shake = Handshake(UserNamespace(host_uid=65534, host_gid=65533, args_at=3))
    try:
        with pytest.raises(OSError, match="bwrap or nsenter expected"):
            shake.popen(["sh", "-c", "true", "--"])
    finally:
        shake.started()
        shake.close()
