"""Issue 12 L3: ``workflow delete|prune`` and the server's run-folder retention.

Real server and CLIs in a home of their own; datasets a workflow uploaded must survive."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cli_e2e_support import processes_of, run_cli, wait_gone

ECHO = """workflow:
  name: tidy
  tasks:
  - name: t
    image: busybox
    command: [sh, -c]
    args: ["echo kept > '{{output}}/m.txt'"]
    outputs:
    - dataset:
        name: tidy-model
"""

NAP = """workflow:
  name: nap
  tasks:
  - name: t
    image: busybox
    command: [sleep]
    args: ["60"]
"""


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    made = tmp_path / "tidy home"
    made.mkdir()
    yield made
    run_cli(made, "server", "stop")
    assert not wait_gone(processes_of(made), timeout_s=30)


def submit(home: Path, spec: Path, *args: str, **env: str) -> str:
    got = run_cli(home, "workflow", "submit", str(spec), *args, "-t", "json", **env)
    assert got.code == 0, got.err
    return got.json()["id"]


def test_delete_and_prune_remove_rows_and_run_folders_never_uploads(
    home: Path, tmp_path: Path
) -> None:
    echo, nap = tmp_path / "echo.yaml", tmp_path / "nap.yaml"
    echo.write_text(ECHO)
    bobs_echo = tmp_path / "bobs-echo.yaml"  # a dataset belongs to its creator: bob's own
    bobs_echo.write_text(ECHO.replace("tidy-model", "tidy-bob-model"))
    nap.write_text(NAP)
    done = [submit(home, echo, "--wait") for _ in range(3)]
    running = submit(home, nap)
    bob = run_cli(home, "server", "add-user", "bob").out.strip()
    bobs = submit(home, bobs_echo, "--wait", TRAINYARD_TOKEN=bob)
    runs = home / "runs"
    assert {p.name for p in runs.iterdir()} >= {*done, running, bobs}

    refused = run_cli(home, "workflow", "delete", done[0], running)  # all or none
    assert refused.code == 4, refused.err
    assert f"workflow {running} is" in refused.err and "cancel it first" in refused.err
    assert (runs / done[0]).is_dir() and (runs / running).is_dir()
    not_yours = run_cli(home, "workflow", "delete", done[0], TRAINYARD_TOKEN=bob)
    assert not_yours.code == 8, not_yours.err
    assert run_cli(home, "workflow", "delete", "tidy-99").code == 3

    deleted = run_cli(home, "workflow", "delete", done[0], "-t", "json")
    assert deleted.json() == {"deleted": [done[0]]}
    assert not (runs / done[0]).exists()
    assert not (home / "local" / "attempts" / done[0]).exists()  # the backend's index too
    assert (home / "local" / "attempts" / done[1]).is_dir()
    assert run_cli(home, "workflow", "query", done[0]).code == 3
    download = tmp_path / "download"
    got = run_cli(home, "dataset", "download", "tidy-model", str(download))
    assert got.code == 0, got.err  # what the workflow uploaded is untouched
    assert (download / "m.txt").read_text() == "kept\n"

    kept = run_cli(home, "workflow", "prune", "--older-than", "1h", "-t", "json")
    assert kept.json() == {"deleted": [], "kept": []}
    dry = run_cli(home, "workflow", "prune", "--older-than", "0", "--dry-run", "-t", "json")
    assert sorted(dry.json()["deleted"]) == sorted([*done[1:], bobs])
    assert all((runs / wid).is_dir() for wid in done[1:])
    bob_pruned = run_cli(
        home, "workflow", "prune", "--older-than", "0", "-t", "json", TRAINYARD_TOKEN=bob
    )
    assert bob_pruned.json() == {"deleted": [bobs], "kept": []}  # only his own
    url = json.loads((home / "server.lock").read_text())["url"]
    batch = httpx.post(
        f"{url}/api/workflow/prune",
        json={"older_than_s": 0, "limit": 1},
        headers={"Authorization": f"Bearer {(home / 'token').read_text().strip()}"},
    )
    assert batch.json() == {"deleted": [done[1]], "kept": [], "more": True}  # oldest first
    pruned = run_cli(home, "workflow", "prune", "--older-than", "0s")
    assert pruned.code == 0, pruned.err
    assert "1 workflow(s) deleted" in pruned.out
    left = run_cli(home, "workflow", "list", "-t", "json").json()
    assert [w["id"] for w in left] == [running]
    assert {p.name for p in runs.iterdir()} == {running}
    assert run_cli(home, "workflow", "prune", "--older-than", "soon").code == 2
    run_cli(home, "workflow", "cancel", running)


def test_the_server_removes_old_run_folders_and_keeps_the_rows(home: Path, tmp_path: Path) -> None:
    echo = tmp_path / "echo.yaml"
    echo.write_text(ECHO)
    bad = run_cli(home, "workflow", "list", TRAINYARD_RUN_RETENTION="a week")
    assert bad.code == 4 and "TRAINYARD_RUN_RETENTION='a week'" in bad.err, bad.err
    wid = submit(home, echo, "--wait", TRAINYARD_RUN_RETENTION="1s")
    orphan = home / "runs" / "gone-1"  # a delete killed between its row and its folder
    orphan.mkdir()
    deadline = time.monotonic() + 90  # the first sweep runs 10 s after the start
    while (home / "runs" / wid).exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert not (home / "runs" / wid).exists(), (home / "server.log").read_text()
    assert not orphan.exists()
    query = run_cli(home, "workflow", "query", wid, "-t", "json")
    assert query.json()["status"] == "COMPLETED"  # the row stays; only the folder went
    log = (home / "server.log").read_text()
    assert "retention: removed the run folders of" in log


def test_retention_is_off_when_asked(home: Path, tmp_path: Path) -> None:
    echo = tmp_path / "echo.yaml"
    echo.write_text(ECHO)
    wid = submit(home, echo, "--wait", TRAINYARD_RUN_RETENTION="off")
    time.sleep(15)
    assert (home / "runs" / wid).is_dir()
    assert json.loads((home / "server.lock").read_text())["pid"] > 0


def test_the_default_retention_is_the_leftover_window() -> None:
    from trainyard.engine.recovery import LEFTOVER_WINDOW_S
    from trainyard.engine.retention import DEFAULT_RUN_RETENTION_S, run_retention_s

    assert DEFAULT_RUN_RETENTION_S == LEFTOVER_WINDOW_S == run_retention_s("")
    assert run_retention_s("12h") == 12 * 3600 and run_retention_s("off") is None
