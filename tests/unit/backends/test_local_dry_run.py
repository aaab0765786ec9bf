"""The local backend's dry run: each task's runner command, sandbox prefix and run file,
with nothing started or written, and no API token shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_local_request import launch

from trainyard.backends.base import Backend
from trainyard.backends.local import Isolation, LocalBackend
from trainyard.backends.local import backend as local_mod


@pytest.mark.parametrize(
    "iso",
    [Isolation(bwrap=False, netns=False), Isolation(bwrap=True, netns=False)],
    ids=["none", "bwrap"],
)
def test_dry_run_shows_each_task_and_writes_nothing(
    tmp_path: Path, iso: Isolation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_SERVER_URL", "http://127.0.0.1:9")
    monkeypatch.setattr(local_mod, "probe_isolation", lambda *_args: iso)
    backend = LocalBackend(home=tmp_path / "home")
    assert isinstance(backend, Backend)
    text = backend.dry_run([launch(tmp_path)])
    head, runner, prefix, where, *run_file = text.splitlines()
    assert head == "# task t (retry 0) on node local-0"
    assert runner.startswith("$ ") and runner.endswith(
        f"-m trainyard.runner {tmp_path}/runs/wf/t/0/run.json"
    )
    assert prefix.startswith("# the command runs under: ")
    assert ("bwrap" in prefix) is iso.bwrap
    run = json.loads("\n".join(run_file))
    assert where.endswith("run.json:") and run["task"] == "t" and run["command"][0] == "sh"
    assert "TRAINYARD_TOKEN" not in text and run["sandbox"]["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert not (tmp_path / "runs").exists() and not (tmp_path / "home" / "local").exists()
