"""``workflow rsync``'s forms (fast, no server): OSMO's ``ID [TASK] LOCAL:REMOTE``,
``upload|download ID [TASK] PATHS`` and trainyard's ``ID TASK SRC DST``; where the copy
lands (rsync's rule for OSMO's forms); the daemon's change detection."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import typer

from trainyard.cli.rsync_copy import RsyncRequest, parse_rsync_args
from trainyard.cli.rsync_daemon import log_path, snapshot


def test_osmo_form_uploads_to_the_default_task_and_the_folder_lands_inside() -> None:
    made = parse_rsync_args(["wf-1", "/home/me/my/path:/osmo/run/workspace"])
    assert made == RsyncRequest("wf-1", None, "/home/me/my/path", "/osmo/run/workspace", True)
    assert made.destination() == "/osmo/run/workspace/path"
    contents = parse_rsync_args(["wf-1", "train", "./src/:/osmo/run/workspace"])
    assert (contents.task, contents.destination()) == ("train", "/osmo/run/workspace")


def test_home_is_expanded_and_a_colon_in_the_local_path_is_kept() -> None:
    made = parse_rsync_args(["upload", "wf-1", "~/a:b:/w"])
    assert made.local == os.path.expanduser("~/a:b") and made.inside == "/w"


def test_download_lands_inside_the_local_folder() -> None:
    made = parse_rsync_args(["download", "wf-1", "/osmo/run/workspace/out:./here"])
    assert (made.into_task, made.task, made.local) == (False, None, "./here")
    assert made.destination() == os.path.join("./here", "out")
    whole = parse_rsync_args(["download", "wf-1", "t", "/osmo/run/workspace/:./here"])
    assert (whole.task, whole.destination()) == ("t", "./here")


def test_trainyards_form_is_kept_and_its_destination_is_the_copy() -> None:
    made = parse_rsync_args(["wf-1", "t", "./data", "t:/tmp/data"])
    assert made == RsyncRequest("wf-1", "t", "./data", "/tmp/data", True, copy_is_target=True)
    assert made.destination() == "/tmp/data"
    out = parse_rsync_args(["wf-1", "t", "t:/tmp/out", "./out"])
    assert (out.into_task, out.destination()) == (False, "./out")


@pytest.mark.parametrize(
    "args",
    [
        ["wf-1"],  # no paths
        ["wf-1", "./no-colon"],
        ["wf-1", "./x:relative"],  # the task's path must be absolute
        ["wf-1", "./x:/tmp/../etc"],
        ["wf-1", "./x:/"],
        ["download", "wf-1", "/a"],
        ["upload", "wf-1", "t", "x", "./x:/w"],  # too many
        ["wf-1", "t", "a", "b"],  # trainyard's form without the task's side
    ],
)
def test_other_forms_are_refused_with_what_is_expected(args: list[str]) -> None:
    with pytest.raises(typer.BadParameter):
        parse_rsync_args(args)


def test_the_daemon_log_lives_in_the_users_state_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert log_path("wf-1", "t") == tmp_path / "trainyard" / "rsync" / "rsync_daemon_wf-1_t.log"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert str(log_path("wf-1", "t")).startswith(os.path.expanduser("~/.local/state/trainyard/"))


def test_a_snapshot_changes_with_a_new_or_changed_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a").write_text("1")
    before = snapshot(tmp_path)
    assert snapshot(tmp_path) == before and set(before) == {"sub", os.path.join("sub", "a")}
    (tmp_path / "b").write_text("2")
    with_b = snapshot(tmp_path)
    assert with_b != before
    stamp = time.time() + 5
    os.utime(tmp_path / "sub" / "a", (stamp, stamp))
    assert snapshot(tmp_path) != with_b
    assert snapshot(tmp_path / "missing") == {}
