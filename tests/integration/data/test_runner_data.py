"""The task runner with the data layer's hook: url and dataset inputs and outputs, exit codes."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from data_support import execute, exit_event, log_text, make_run, make_tree, tree

from trainyard.data import DatasetStore
from trainyard.runner.main import Runner

pytestmark = pytest.mark.usefixtures("home")


def test_url_input_with_regex_gets_exactly_the_matching_files(tmp_path: Path) -> None:
    src = make_tree(
        tmp_path / "src",
        {"a.txt": "a", "b.json": "b", "deep/c.txt": "c", "deep/d.bin": "d", "txt.not": "e"},
    )
    run = make_run(
        tmp_path,
        "ls -R {{input:0}}\n",
        inputs=[{"kind": "url", "name": "u", "source": f"file://{src}/", "regex": r".*\.txt$"}],
    )
    assert execute(run) == 0
    assert tree(run.input_path(0)) == {"a.txt": "a", "deep/c.txt": "c"}
    assert "downloaded 2 file(s)" in log_text(run)  # the throughput line reaches the task log


def test_url_outputs_are_uploaded_after_success_with_the_regex(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    run = make_run(
        tmp_path,
        "echo 1 > {{output}}/a.json\necho 2 > {{output}}/b.bin\n"
        "mkdir {{output}}/d\necho 3 > {{output}}/d/c.yaml\n",
        outputs=[{"url": f"file://{dest}/{{{{workflow_id}}}}/", "regex": r"\.(json|yaml)$"}],
    )
    assert execute(run) == 0
    assert tree(dest / "wf-data") == {"a.json": "1\n", "d/c.yaml": "3\n"}
    assert "uploaded 2 file(s)" in log_text(run)


def test_outputs_are_not_uploaded_after_a_failure(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    run = make_run(
        tmp_path,
        "echo 1 > {{output}}/a.json\nexit 3\n",
        outputs=[{"url": f"file://{dest}/"}, {"dataset": {"name": "results"}}],
    )
    assert execute(run) == 3
    assert not dest.exists()
    assert DatasetStore().names() == []


def test_outputs_are_not_uploaded_after_a_cancel(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    run = make_run(
        tmp_path,
        "echo 1 > {{output}}/a.json\nsleep 30\n",
        outputs=[{"url": f"file://{dest}/"}, {"dataset": {"name": "results"}}],
    )
    runner = Runner(run)
    threading.Thread(target=_cancel_when_running, args=(runner,), daemon=True).start()
    assert runner.execute() == 128 + signal.SIGTERM
    assert not dest.exists()
    assert DatasetStore().names() == []


def _cancel_when_running(runner: Runner) -> None:
    events = Path(runner.run.run_dir) / "events.jsonl"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "RUNNING" not in (
        events.read_text() if events.exists() else ""
    ):
        time.sleep(0.02)
    time.sleep(0.3)
    runner.on_signal(signal.SIGTERM, None)


def test_dataset_output_creates_a_version_and_latest_input_downloads_it(tmp_path: Path) -> None:
    writer = make_run(
        tmp_path,
        "mkdir -p {{output}}/model\necho w1 > {{output}}/model/w.pt\n"
        "echo log > {{output}}/train.log\n",
        outputs=[{"dataset": {"name": "weights:gold", "path": "model"}}],
    )
    assert execute(writer) == 0
    version = DatasetStore().resolve("weights:latest")
    assert (version.version, [f.path for f in version.files]) == (1, ["w.pt"])
    assert DatasetStore().info("weights").tags == {"gold": 1, "latest": 1}

    reader = make_run(
        tmp_path,
        "cat {{input:0}}/w.pt\n",
        task="t2",
        inputs=[{"kind": "dataset", "name": "weights:latest", "source": "weights:latest"}],
    )
    assert execute(reader) == 0
    assert tree(reader.input_path(0)) == {"w.pt": "w1\n"}
    assert "[t2] w1" in log_text(reader)


def test_a_second_dataset_output_is_a_new_version(tmp_path: Path) -> None:
    for round_ in (1, 2):
        run = make_run(
            tmp_path,
            f"echo {round_} > {{{{output}}}}/r.txt\n",
            task=f"t{round_}",
            outputs=[{"dataset": {"name": "runs"}}],
        )
        assert execute(run) == 0
    assert [v.version for v in DatasetStore().versions("runs")] == [1, 2]
    reader = make_run(
        tmp_path,
        "true\n",
        task="reader",
        inputs=[{"kind": "dataset", "name": "runs:1", "source": "runs:1"}],
    )
    assert execute(reader) == 0
    assert tree(reader.input_path(0)) == {"r.txt": "1\n"}


def test_a_missing_dataset_fails_the_download_with_2010(tmp_path: Path) -> None:
    run = make_run(
        tmp_path, "echo ran\n", inputs=[{"kind": "dataset", "name": "nope", "source": "nope:3"}]
    )
    assert execute(run) == 2010
    code, message = exit_event(run)
    assert code == 2010 and "nope" in message
    assert "[t1] ran" not in log_text(run)


def test_nothing_at_an_input_url_is_an_empty_input_named_in_the_log(tmp_path: Path) -> None:
    """OSMO's reschedule sample reads its checkpoint location before anything is there."""
    run = make_run(
        tmp_path,
        "ls {{input:0}} | wc -l\n",
        inputs=[{"kind": "url", "name": "u", "source": f"file://{tmp_path}/absent/"}],
    )
    assert execute(run) == 0
    assert f"{tmp_path}/absent/: nothing there yet, the input is an empty folder" in log_text(run)
    assert "[t1] 0" in log_text(run)


def test_checkpoints_upload_committed_rounds_while_the_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = tmp_path / "remote"
    monkeypatch.setenv("REMOTE", str(remote))
    run = make_run(
        tmp_path,
        "mkdir -p ck\necho 1 > ck/a.pth\necho skip > ck/b.log\n"
        "i=0; while [ ! -f $REMOTE/a.pth ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n"
        "[ -f $REMOTE/a.pth ] && echo uploaded-while-running\n"
        "echo 2 > ck/c.pth\n",
        checkpoints=[
            {"path": "ck", "url": f"file://{remote}", "frequency_s": 0.1, "regex": r"\.pth$"}
        ],
    )
    assert execute(run) == 0
    assert "[t1] uploaded-while-running" in log_text(run)
    assert "checkpoint round" in log_text(run)
    reader = make_run(
        tmp_path,
        "true\n",
        task="t2",
        inputs=[{"kind": "url", "name": "ck", "source": f"file://{remote}"}],
    )
    assert execute(reader) == 0
    assert tree(reader.input_path(0)) == {"a.pth": "1\n", "c.pth": "2\n"}  # the final round


def test_task_inputs_still_copy_the_upstream_output_folder(tmp_path: Path) -> None:
    upstream = make_run(
        tmp_path, "echo a > {{output}}/a.txt\necho b > {{output}}/b.bin\n", task="up"
    )
    assert execute(upstream) == 0
    run = make_run(
        tmp_path,
        "cat {{input:up}}/a.txt\n",
        task="down",
        inputs=[
            {"kind": "task", "name": "up", "source": str(upstream.output_path), "regex": r"\.txt$"}
        ],
    )
    assert execute(run) == 0
    assert tree(run.input_path(0)) == {"a.txt": "a\n"}
    assert tree(upstream.output_path) == {"a.txt": "a\n", "b.bin": "b\n"}  # kept for others
