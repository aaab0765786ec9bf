"""OSMO's data_upload then data_download tutorials (shared/osmo-specs/EXPECTATIONS.md: "they
name s3://my-bucket: an S3-compatible endpoint on loopback with that bucket, data/ seeded")
submitted as workflows to the real engine on the local pool: each task a sandboxed task runner
process started by the local backend, moving its data through s3fs to moto's S3 server on
loopback (the session's ``moto_s3``, bucket ``my-bucket``). test_osmo_data_specs.py runs the
same specs one level down, through the task runner alone.

The specs' keys (``data/``, ``models/``) are fixed and the session's server is shared, so the
test clears those two prefixes before and after it runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from data_support import tree

from trainyard import spec
from trainyard.data.testing import MotoS3
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import default_local_pool
from trainyard.runfile import TaskRun
from trainyard.store import Store

SPECS = Path(__file__).resolve().parents[4] / "shared" / "osmo-specs" / "tutorials"

pytestmark = [
    pytest.mark.skipif(
        not SPECS.is_dir(),
        reason=f"OSMO conformance specs not found at {SPECS} (shared/ must sit beside the repo)",
    ),
    pytest.mark.timeout(180),
]

BUCKET = "my-bucket"
SPEC_PREFIXES = ("data/", "models/")
SEED = {  # what data_download's url input s3://my-bucket/data/ holds
    "data/train.csv": b"x,y\n1,2\n3,4\n",
    "data/blob.bin": bytes(range(256)) * 40,  # 10240 bytes, every byte value
    "data/nested/val.csv": b"v\n7\n",
}


def _clear(server: MotoS3) -> None:
    client = server.client()
    for prefix in SPEC_PREFIXES:
        for key in server.keys(BUCKET, prefix):
            client.delete_object(Bucket=BUCKET, Key=key)


@pytest.fixture
def bucket(s3_env: MotoS3) -> Iterator[MotoS3]:
    """``my-bucket`` with only ``data/`` seeded under the specs' prefixes; cleared afterwards."""
    _clear(s3_env)
    client = s3_env.client()
    for key, body in SEED.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
    yield s3_env
    _clear(s3_env)


@pytest.fixture
def engine(home: Path) -> Iterator[Engine]:
    """The real engine with the local backend on the ``local`` pool, its store and runs under
    ``$TRAINYARD_HOME`` (the ``home`` fixture's; the task runners inherit the environment,
    S3 endpoint included). ``Engine.wait`` drives its steps."""
    home.mkdir(parents=True, exist_ok=True)
    made = Engine(
        Store(f"sqlite:///{home / 'db.sqlite'}"), home, pools={"local": default_local_pool()}
    )
    yield made
    made.close()


def _submit(engine: Engine, name: str) -> str:
    doc = spec.load(SPECS / name)
    pool = engine.pools["local"]
    return engine.submit(
        Submission(
            spec=doc.workflow, spec_text=(SPECS / name).read_text(), user="conformance", pool=pool
        )
    ).id


def _only_task(engine: Engine, workflow_id: str) -> tuple[str, TaskRun, str]:
    """(status, the attempt's TaskRun as the backend wrote it, task log) of a one-task workflow."""
    ((name, task),) = engine.state(workflow_id).tasks.items()
    run_dir = engine.run_dir(workflow_id, name, 0)
    run = TaskRun.model_validate_json((run_dir / "run.json").read_text())
    log = (run_dir / "task.log").read_text(errors="replace")
    return task.status.value, run, log


def test_data_upload_then_data_download_run_as_workflows_against_loopback_s3(
    bucket: MotoS3, engine: Engine
) -> None:
    assert os.environ["TRAINYARD_S3_ENDPOINT_URL"] == bucket.endpoint_url
    assert bucket.endpoint_url.startswith("http://127.0.0.1:")
    assert bucket.keys(BUCKET, "models/") == []

    # data_upload: the task writes {{output}}/results/model.pth; its url output puts it at
    # s3://my-bucket/models/ once the command has succeeded
    upload = _submit(engine, "data_upload.yaml")
    assert engine.wait(upload, timeout_s=120).status == "COMPLETED", engine.state(upload)
    status, _run, log = _only_task(engine, upload)
    assert status == "COMPLETED", log[-3000:]
    assert "Upload complete" in log
    assert bucket.keys(BUCKET, "models/") == ["models/results/model.pth"]
    body = bucket.client().get_object(Bucket=BUCKET, Key="models/results/model.pth")["Body"].read()
    assert body == b"Model checkpoint\n"

    # data_download: s3://my-bucket/data/ lands in {{input:0}} before the command lists it
    download = _submit(engine, "data_download.yaml")
    assert engine.wait(download, timeout_s=120).status == "COMPLETED", engine.state(download)
    status, run, log = _only_task(engine, download)
    assert status == "COMPLETED", log[-3000:]
    got = {rel: (run.input_path(0) / rel).read_bytes() for rel in tree(run.input_path(0))}
    assert got == {key.removeprefix("data/"): body for key, body in SEED.items()}
    # what the task's own `ls -la {{input:0}}/` printed, sizes included
    listing = {
        line.split()[-1]: line.split()
        for line in log.splitlines()
        if "[load-from-cloud] " in line and len(line.split()) >= 11
    }
    assert listing["train.csv"][-5] == str(len(SEED["data/train.csv"])), listing
    assert listing["blob.bin"][-5] == "10240", listing
    assert listing["nested"][3].startswith("d"), listing  # the folder, listed by the task
    assert "Loading data from S3..." in log and "Download complete" in log
    # the upload's object is still there, and nothing else was written under the prefixes
    assert bucket.keys(BUCKET, "models/") == ["models/results/model.pth"]
    assert bucket.keys(BUCKET, "data/") == sorted(SEED)
