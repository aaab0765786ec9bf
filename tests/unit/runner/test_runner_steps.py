"""The task runner end to end, with real commands (sh) in a private root folder."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from runner_support import MakeRun, event_kinds, execute, log_text, write_run_json

from trainyard.runner.barrier import mark_ready


def test_tokens_resolve_in_args_and_files(make_run: MakeRun, tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    upstream.mkdir()
    (upstream / "data.txt").write_text("from upstream\n")
    run = make_run(
        script="echo wf={{workflow_id}}\necho host={{ host:server }}\n"
        "cat {{input:0}}/data.txt\ncat {{input:task0}}/data.txt\n"
        "echo done > {{output}}/result.txt\n",
        args=["{{output}}"],
        hosts={"server": "127.9.8.7"},
        inputs=[{"kind": "task", "name": "task0", "source": str(upstream)}],
    )
    assert execute(run) == 0
    text = log_text(run)
    assert "[t1] wf=wf-7" in text and "[t1] host=127.9.8.7" in text
    assert text.count("[t1] from upstream") == 2
    assert (run.output_path / "result.txt").read_text() == "done\n"


def test_k8s_vars_expand_from_environment_in_args_only(make_run: MakeRun) -> None:
    run = make_run(
        command=["sh"],
        args=["$(FILE_PATH)", "$$(FILE_PATH)"],
        environment={"FILE_PATH": "/tmp/run.sh"},
        files=[{"path": "/tmp/run.sh", "contents": 'echo "arg=$1 file=$(FILE_PATH)"\n'}],
    )
    assert execute(run) == 0
    assert "[t1] arg=$(FILE_PATH) file=" in log_text(run)  # $(...) in a file is shell


def test_environment_carries_distributed_identity(make_run: MakeRun) -> None:
    run = make_run(
        script="echo id=$TRAINYARD_WORKFLOW_ID/$OSMO_WORKFLOW_ID/$TRAINYARD_TASK_NAME/"
        "$TRAINYARD_GROUP/$TRAINYARD_RETRY_ID/$TRAINYARD_TASK_INDEX\n"
        "echo lead=$TRAINYARD_LEAD_HOST tasks=$TRAINYARD_GROUP_TASKS\n"
        "echo out=$TRAINYARD_OUTPUT\ncommand -v python\ncommand -v trainyard\n",
        task="w1",
        retry_id=2,
        group_tasks=["m", "w1"],
        task_index=1,
        lead_task="m",
        hosts={"m": "127.1.1.1", "w1": "127.1.1.2"},
    )
    assert execute(run) == 0
    text = log_text(run)
    assert "id=wf-7/wf-7/w1/g/2/1" in text
    assert "lead=127.1.1.1 tasks=m,w1" in text
    assert f"out={run.output_dir}" in text
    # python is the task's own environment's (runner.pyenv), trainyard's CLI trainyard's
    assert f"[w1] {run.sandbox.root}/trainyard/venv/bin/python" in text
    assert f"[w1] {Path(sys.executable).parent}/trainyard" in text


def test_log_lines_and_events(make_run: MakeRun) -> None:
    run = make_run(script="echo to-stdout\necho to-stderr >&2\nexit 3\n", retry_id=4)
    assert execute(run) == 3
    lines = log_text(run).splitlines()
    stamp = r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d "
    assert all(re.match(stamp + r"\[t1\](\[trainyard\])? ", l) for l in lines), lines
    assert re.match(stamp + r"\[t1\]\[trainyard\] .*retry 4", lines[0])
    assert any(l.endswith("[t1] to-stdout") for l in lines)
    assert any(l.endswith("[t1] to-stderr") for l in lines)
    assert event_kinds(run) == [("INITIALIZING", None), ("RUNNING", None), ("EXITED", 3)]


def test_private_root_rewrites_tmp_and_cwd(make_run: MakeRun) -> None:
    run = make_run(script="pwd\necho hi > tmp/rel.txt\ncat /tmp/rel.txt\necho $TMPDIR\n")
    assert execute(run) == 0
    root = Path(str(run.sandbox.root))
    text = log_text(run)
    assert f"[t1] {root}\n" in text and "[t1] hi\n" in text and f"[t1] {root}/tmp\n" in text
    assert (root / "tmp" / "run.sh").exists()


def test_private_root_places_files_under_existing_host_folders_too(make_run: MakeRun) -> None:
    run = make_run(
        command=["sh", "/usr/trainyard-x/run.sh"],
        files=[
            {
                "path": "/usr/trainyard-x/run.sh",
                "contents": "mkdir -p /ckpt-x && echo 1 > /ckpt-x/a.pth && echo ok\n",
            }
        ],
        checkpoints=[{"path": "/ckpt-x", "url": "file:///dev/null/never", "frequency_s": 60}],
    )
    assert execute(run) == 0
    root = Path(str(run.sandbox.root))
    assert (root / "usr" / "trainyard-x" / "run.sh").exists()
    assert (root / "ckpt-x" / "a.pth").exists() and not Path("/ckpt-x").exists()
    assert "[t1] ok" in log_text(run)


def test_barrier_passes_when_all_tasks_are_ready(make_run: MakeRun, tmp_path: Path) -> None:
    folder = tmp_path / "rdv"
    run = make_run(
        script="echo go\n",
        group_tasks=["t1", "t2"],
        barrier={"enabled": True, "folder": str(folder), "tasks": ["t1", "t2"], "timeout_s": 10},
    )
    late = threading.Timer(0.5, mark_ready, (folder, "t2", 0))
    late.start()
    started = time.monotonic()
    assert execute(run) == 0
    assert time.monotonic() - started >= 0.45
    assert "[t1] go" in log_text(run)


def test_barrier_timeout_is_2024_and_command_never_runs(make_run: MakeRun, tmp_path: Path) -> None:
    run = make_run(
        script="echo ran\n",
        barrier={
            "enabled": True,
            "folder": str(tmp_path / "rdv"),
            "tasks": ["t1", "t2"],
            "timeout_s": 0.3,
        },
    )
    assert execute(run) == 2024
    assert "ran" not in log_text(run) and "t2" in log_text(run)
    assert event_kinds(run) == [("INITIALIZING", None), ("EXITED", 2024)]


def test_input_copy_failure_is_2010(make_run: MakeRun, tmp_path: Path) -> None:
    run = make_run(
        script="echo ran\n",
        inputs=[{"kind": "task", "name": "t0", "source": str(tmp_path / "missing")}],
    )
    assert execute(run) == 2010
    assert event_kinds(run) == [("INITIALIZING", None), ("EXITED", 2010)]


def test_url_input_with_regex(make_run: MakeRun, tmp_path: Path) -> None:
    src = tmp_path / "store" / "source-data"
    (src / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.json", "sub/c.txt"):
        (src / name).write_text(name)
    run = make_run(
        script="ls -R {{input:0}}\n",
        inputs=[{"kind": "url", "name": "u", "source": f"file://{src}/", "regex": r".*\.txt$"}],
    )
    assert execute(run) == 0
    got = sorted(
        p.relative_to(run.input_path(0)).as_posix()
        for p in run.input_path(0).rglob("*")
        if p.is_file()
    )
    assert got == ["a.txt", "sub/c.txt"]


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_outputs_upload_regex_matches_after_success(make_run: MakeRun, tmp_path: Path) -> None:
    dest = tmp_path / "bucket" / "out"
    run = make_run(
        script="echo 1 > {{output}}/a.json\necho 2 > {{output}}/b.bin\n"
        "mkdir {{output}}/d\necho 3 > {{output}}/d/c.yaml\n",
        outputs=[{"url": f"file://{dest}/", "regex": r".*\.(json|yaml)$"}],
    )
    assert execute(run) == 0
    assert _files(dest) == ["a.json", "d/c.yaml"]


def test_outputs_are_not_uploaded_after_failure(make_run: MakeRun, tmp_path: Path) -> None:
    dest = tmp_path / "bucket" / "out"
    run = make_run(
        script="echo 1 > {{output}}/a.json\nexit 1\n", outputs=[{"url": f"file://{dest}/"}]
    )
    assert execute(run) == 1
    assert not dest.exists()


def test_output_upload_failure_is_2012(make_run: MakeRun, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    run = make_run(
        script="echo 1 > {{output}}/a.json\n", outputs=[{"url": f"file://{blocker}/sub/"}]
    )
    assert execute(run) == 2012
    assert event_kinds(run)[-1] == ("EXITED", 2012)


def test_command_not_found_is_127(make_run: MakeRun) -> None:
    run = make_run(command=["no-such-command-trainyard"])
    assert execute(run) == 127


def test_leftover_background_processes_die_with_the_command(make_run: MakeRun) -> None:
    run = make_run(script="sleep 397 &\nsleep 397 &\necho started\n")
    assert execute(run) == 0
    time.sleep(0.2)
    assert not [
        p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "397"]
    ]


def test_children_the_host_process_had_before_the_command_are_left_alone(make_run: MakeRun) -> None:
    """The runner in-process (as here, in a test) kills what its command left, never the
    host's own children, such as a CLI a test started in the background."""
    bystander = subprocess.Popen(["sleep", "396"])
    try:
        assert execute(make_run(script="sleep 397 &\necho started\n")) == 0
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def _sleepers(marker: str) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["cmdline"] == ["sleep", marker] and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


@pytest.mark.parametrize("trap_exit", [None, 0])
def test_sigterm_stops_the_whole_tree_and_never_reports_success(
    make_run: MakeRun, trap_exit: int | None
) -> None:
    trap = f"trap 'exit {trap_exit}' TERM\n" if trap_exit is not None else ""
    run = make_run(
        script=trap + "sh -c 'sleep 398 & sleep 398' &\nsleep 398 &\nwait\n", stop_grace_s=1.0
    )
    proc = subprocess.Popen([sys.executable, "-m", "trainyard.runner", str(write_run_json(run))])
    deadline = time.monotonic() + 10
    while len(_sleepers("398")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_sleepers("398")) == 3
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) != 0
    kind, code = event_kinds(run)[-1]
    assert kind == "EXITED" and code not in (0, None)
    time.sleep(0.2)
    assert _sleepers("398") == []


def test_module_entry_point_exit_code(make_run: MakeRun) -> None:
    run = make_run(script="exit 7\n")
    done = subprocess.run(
        [sys.executable, "-m", "trainyard.runner", str(write_run_json(run))],
        env={**os.environ},
        timeout=30,
    )
    assert done.returncode == 7


def test_data_layer_hook_is_used_when_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainyard.data
    from trainyard.data.runnerhook import FsspecData, load_data_hook

    class Marked(FsspecData):
        def __init__(self, log: object) -> None:
            self.log = log

    monkeypatch.setattr(trainyard.data, "runner_hook", Marked, raising=False)
    hook = load_data_hook(print)
    assert isinstance(hook, Marked) and hook.log is print
    monkeypatch.delattr(trainyard.data, "runner_hook")
    assert type(load_data_hook()) is FsspecData
