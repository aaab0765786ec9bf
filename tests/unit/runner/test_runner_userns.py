"""The runner's side of the task's user namespace (``runner.userns``): where the handshake's
descriptors go, and giving folders to the task's host uid without following links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainyard.runner.userns import give_to_task, give_tree, insert_fds


def test_the_descriptors_go_before_bwraps_end() -> None:
    argv = ["nsenter", "--net=/x", "--", "bwrap", "--bind", "/r", "/", "--", "setpriv", "--", "sh"]
    assert insert_fds(argv, 7, 5, 6) == [*argv[:7], "--info-fd", "5", "--userns-block-fd", "6",
                                         *argv[7:]]


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
    from trainyard.runner.command import CommandProcess
    from trainyard.runner.spec import UserNamespace

    lines: list[str] = []
    argv = ["sh", "-c", "exit 1", "--"]  # not bwrap: reports no child and ends
    proc = CommandProcess(argv, {"PATH": os.defpath}, str(tmp_path),
                          lambda text, _cut: lines.append(text),
                          userns=UserNamespace(host_uid=65534, host_gid=65534, args_at=3))
    with pytest.raises(OSError, match="before its user namespace"):
        proc.start()
