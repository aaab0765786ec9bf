"""``linux.userns.make_fresh``: the folders and files a task gets empty and as its own
(apt's download folders and logs, its ``apt.conf.d`` setting), made by the runner as root
following no symlink the task left; an earlier attempt's (RESTART) is kept."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trainyard.linux.userns import make_fresh
from trainyard.runfile import FreshPath

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid (chown)")

UID = 65534


def test_what_the_host_had_is_replaced_by_the_tasks_own(tmp_path: Path) -> None:
    (tmp_path / "log/apt").mkdir(parents=True)
    (tmp_path / "log/apt/term.log").write_text("host's\n")
    (tmp_path / "log/dpkg.log").write_text("host's\n")
    (tmp_path / "conf.d").mkdir()
    make_fresh(
        [
            FreshPath(base=str(tmp_path), relative="log/apt", is_dir=True),
            FreshPath(base=str(tmp_path), relative="log/dpkg.log", is_dir=False, mode=0o644),
            FreshPath(
                base=str(tmp_path),
                relative="conf.d/99x",
                is_dir=False,
                mode=0o644,
                text="A::B \"root\";\n",
            ),
        ],
        UID,
        UID,
    )
    folder = os.lstat(tmp_path / "log/apt")
    assert os.listdir(tmp_path / "log/apt") == []
    assert (folder.st_uid, folder.st_gid, stat.S_IMODE(folder.st_mode)) == (UID, UID, 0o755)
    assert (tmp_path / "log/dpkg.log").read_text() == ""
    assert (tmp_path / "log/dpkg.log").stat().st_uid == UID
    assert (tmp_path / "conf.d/99x").read_text() == "A::B \"root\";\n"


def test_an_earlier_attempts_own_is_kept_and_a_missing_parent_skipped(tmp_path: Path) -> None:
    (tmp_path / "apt").mkdir()
    (tmp_path / "apt/kept.log").write_text("the task's\n")
    os.chown(tmp_path / "apt/kept.log", UID, UID)
    make_fresh(
        [
            FreshPath(base=str(tmp_path), relative="apt/kept.log", is_dir=False),
            FreshPath(base=str(tmp_path), relative="no-apt/lists/partial", is_dir=True),
        ],
        UID,
        UID,
    )
    assert (tmp_path / "apt/kept.log").read_text() == "the task's\n"
    assert not (tmp_path / "no-apt").exists()


def test_no_link_the_task_left_is_followed(tmp_path: Path) -> None:
    base, host = tmp_path / "view", tmp_path / "host"
    base.mkdir()
    (host / "log").mkdir(parents=True)
    (host / "dpkg.log").write_text("host's\n")
    (base / "log").symlink_to(host / "log")  # a folder on the way: skipped, not followed
    make_fresh([FreshPath(base=str(base), relative="log/apt", is_dir=True)], UID, UID)
    assert list((host / "log").iterdir()) == [] and (base / "log").is_symlink()
    (base / "var").mkdir()
    (base / "var/dpkg.log").symlink_to(host / "dpkg.log")  # the entry itself (root's link)
    make_fresh([FreshPath(base=str(base), relative="var/dpkg.log", is_dir=False)], UID, UID)
    assert not (base / "var/dpkg.log").is_symlink()
    assert (host / "dpkg.log").read_text() == "host's\n"
