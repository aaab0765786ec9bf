"""What a pod's task container runs, run here as a process: the runner input of a built
Secret, ``python -m trainyard.backends.kubernetes.podmain RUN_JSON TERMINATION_LOG``: the
task's command runs with ``{{host:TASK}}`` resolved to the pods' DNS names, and the runner's
EXITED event lands in the termination message file with the exact exit code (a service
code too), as the kubelet would read it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from k8s_support import launches, pool

from trainyard.backends.base import TaskResources
from trainyard.backends.kubernetes import build_request, parse_options


def _run(
    tmp_path: Path, command: list[str], **fields: object
) -> tuple[int, dict[str, object], str]:
    gang = launches({"master": TaskResources(), "worker": TaskResources()}, image=None, **fields)
    for launch in gang:  # run folders under tmp_path: the pod's emptyDir
        run_dir = tmp_path / launch.key.task
        launch.run.update(
            run_dir=str(run_dir), output_dir=str(run_dir / "output"), command=command, files=[]
        )
    the_pool = pool({"namespace": "ml"})
    request = build_request(gang[1:], the_pool, parse_options("k8s", the_pool.options), tmp_path)
    run_json = tmp_path / "run.json"
    run_json.write_text(request.secrets[0]["stringData"]["run.json"])
    termination = tmp_path / "termination-log"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainyard.backends.kubernetes.podmain",
            str(run_json),
            str(termination),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = (tmp_path / "worker" / "task.log").read_text()
    assert done.stdout == log  # the container's log is the task log, whole
    return done.returncode, json.loads(termination.read_text()), log


def test_the_command_runs_and_its_exit_is_the_termination_message(tmp_path: Path) -> None:
    code, message, log = _run(tmp_path, ["sh", "-c", "echo peer {{host:master}}; exit 3"])
    assert code == 3
    assert message["kind"] == "EXITED" and message["exit_code"] == 3
    assert "peer master.ty-train-multi-gpu-1-training.ml.svc.cluster.local" in log


def test_a_service_exit_code_survives_in_the_message(tmp_path: Path) -> None:
    code, message, _ = _run(
        tmp_path,
        ["true"],
        inputs=[
            {
                "kind": "task",
                "name": "fetch",
                "source": "/nowhere",
                "unavailable": "task fetch did not complete",
            }
        ],
    )
    assert message["exit_code"] == 2010 and code == 255  # a process exit code stops at 255
