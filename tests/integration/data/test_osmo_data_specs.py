"""OSMO's data tutorials (shared/osmo-specs/EXPECTATIONS.md rows data_filter, data_upload,
data_download) through the spec loader and the task runner with the data layer's hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from data_support import execute, log_text, make_tree, tree

from trainyard import spec
from trainyard.data.testing import MotoS3
from trainyard.runfile import TaskRun
from trainyard.spec.models import TaskSpec

SPECS = Path(__file__).resolve().parents[4] / "shared" / "osmo-specs" / "tutorials"

pytestmark = pytest.mark.skipif(not SPECS.is_dir(), reason="shared/osmo-specs not present")


def _task(name: str, **values: Any) -> TaskSpec:
    doc = spec.load(SPECS / name, set_values=values)
    (task,) = doc.workflow.all_tasks()
    return task


def _run_of(task: TaskSpec, tmp_path: Path, workflow_id: str) -> TaskRun:
    """The TaskRun the engine builds for a one-task workflow (url inputs and outputs only)."""
    run_dir = tmp_path / "runs" / task.name
    (run_dir / "root").mkdir(parents=True)  # the backend makes the private root
    return TaskRun.model_validate(
        {
            "workflow_id": workflow_id,
            "group": task.name,
            "task": task.name,
            "command": list(task.command),
            "args": list(task.args),
            "run_dir": str(run_dir),
            "sandbox": {"root": str(run_dir / "root")},
            "inputs": [
                {"kind": "url", "name": i.url, "source": i.url, "regex": i.regex}
                for i in task.inputs
            ],
            "outputs": [o.model_dump(mode="json") for o in task.outputs],
        }
    )


def test_data_filter_with_a_file_storage_url(tmp_path: Path, home: Path) -> None:
    storage = home / "storage" / "bucket"  # below the pool's default data root
    make_tree(storage / "source-data", {"a.txt": "a", "b.json": "{}", "c.bin": "c", "d/e.txt": "e"})
    task = _task("data_filter.yaml", storage_url=storage.as_uri())
    run = _run_of(task, tmp_path, "filtered-io-1")
    assert execute(run) == 0
    assert tree(run.input_path(0)) == {"a.txt": "a", "d/e.txt": "e"}
    assert " a.txt" in log_text(run) and "c.bin" not in log_text(run)
    assert "output: 0 file(s) uploaded to " in log_text(run)  # the spec writes no output
    assert "filtered-output/filtered-io-1/" in log_text(run)  # {{workflow_id}} resolved


def test_data_filter_output_regex(tmp_path: Path, home: Path) -> None:
    storage = home / "storage" / "bucket"
    make_tree(storage / "source-data", {"a.txt": "a"})
    task = _task("data_filter.yaml", storage_url=storage.as_uri())
    run = _run_of(task, tmp_path, "filtered-io-2")
    run.args = ["cd {{output}} && echo 1 > r.json && echo 2 > r.yaml && echo 3 > r.bin"]
    assert execute(run) == 0
    assert tree(storage / "filtered-output" / "filtered-io-2") == {"r.json": "1\n", "r.yaml": "2\n"}


def test_data_upload_then_data_download_through_s3(tmp_path: Path, s3_env: MotoS3) -> None:
    client = s3_env.client()
    client.put_object(Bucket="my-bucket", Key="data/train.csv", Body=b"x,y\n")
    client.put_object(Bucket="my-bucket", Key="data/nested/val.csv", Body=b"v\n")

    upload = _run_of(_task("data_upload.yaml"), tmp_path / "up", "upload-to-s3-1")
    assert execute(upload) == 0
    assert "[save-to-cloud] Upload complete" in log_text(upload)
    body = client.get_object(Bucket="my-bucket", Key="models/results/model.pth")["Body"].read()
    assert body == b"Model checkpoint\n"

    download = _run_of(_task("data_download.yaml"), tmp_path / "down", "download-from-s3-1")
    assert execute(download) == 0
    assert tree(download.input_path(0)) == {"train.csv": "x,y\n", "nested/val.csv": "v\n"}
    assert "[load-from-cloud] Download complete" in log_text(download)
    assert "train.csv" in log_text(download)
