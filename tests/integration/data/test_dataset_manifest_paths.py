"""A crafted manifest in the dataset store (issue 11: a path with ``..`` or an absolute
path) is refused on download (``trainyard dataset download``, a real process) and on a
task's dataset input (the real runner): nothing is written outside the target folder, and
the error names the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from data_support import execute, log_text, make_run, make_tree

from trainyard.data import DatasetStore
from trainyard.data.transfer import plan_uploads

TRAINYARD = Path(sys.executable).parent / "trainyard"


def craft(home: Path, tmp_path: Path, bad_path: str) -> None:
    """Version 1 of ``evil`` uploaded honestly, then version 2 written by hand: its one file
    (the bytes of version 1's file) named ``bad_path``."""
    make_tree(tmp_path / "src", {"a.txt": "pwned\n"})
    v1 = DatasetStore().upload("evil", plan_uploads([str(tmp_path / "src") + "/"], None))
    manifest = v1.model_dump()
    manifest["version"] = 2
    manifest["files"][0]["path"] = bad_path
    versions = home / "datasets" / "evil" / "versions"
    (versions / "2.json").write_text(json.dumps(manifest))


BAD = ["../../escaped.txt", "a/../../escaped.txt", "/tmp/trainyard-escaped-{pid}.txt"]


@pytest.mark.parametrize("bad", BAD, ids=["dotdot", "inner-dotdot", "absolute"])
def test_download_of_a_crafted_manifest_is_refused(home: Path, tmp_path: Path, bad: str) -> None:
    bad = bad.format(pid=os.getpid())
    craft(home, tmp_path, bad)
    dest = tmp_path / "deep" / "er" / "dest"
    env = {**os.environ, "TRAINYARD_HOME": str(home)}
    done = subprocess.run(
        [str(TRAINYARD), "dataset", "download", "evil:2", str(dest), "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 9, done.stdout + done.stderr
    assert repr(bad) in done.stderr and "leaves the dataset" in done.stderr, done.stderr
    assert not (tmp_path / "deep" / "escaped.txt").exists()
    assert not (tmp_path / "escaped.txt").exists()
    assert not Path(f"/tmp/trainyard-escaped-{os.getpid()}.txt").exists()
    assert not list(dest.rglob("*")) if dest.exists() else True
    latest = subprocess.run(
        [str(TRAINYARD), "dataset", "download", "evil:1", str(dest), "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert latest.returncode == 0, latest.stderr  # the honest version still downloads


def test_a_task_input_of_a_crafted_manifest_fails_2010(home: Path, tmp_path: Path) -> None:
    craft(home, tmp_path, "../../escaped.txt")
    run = make_run(
        tmp_path,
        "ls {{input:0}}\n",
        inputs=[{"kind": "dataset", "name": "evil:2", "source": "evil:2"}],
    )
    assert execute(run) == 2010
    assert "leaves the dataset" in log_text(run)
    assert not (tmp_path / "escaped.txt").exists()
    assert not (run.input_path(0).parent.parent / "escaped.txt").exists()


def test_a_remote_listing_cannot_send_a_download_outside_its_folder(tmp_path: Path) -> None:
    from trainyard.data.storage import RemoteFile
    from trainyard.data.transfer import Mover
    from trainyard.errors import DataError

    mover = Mover()
    loc = mover.location(tmp_path)
    with pytest.raises(DataError, match="leaves"):
        mover.download_files([RemoteFile(str(tmp_path / "x"), "../x", 1)], loc, tmp_path / "d")
