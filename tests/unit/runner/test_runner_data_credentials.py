"""Issue 25: the submitter's DATA credential (OSMO's access_key_id, access_key, endpoint,
region, override_url) is what a task's url inputs and outputs on its endpoint use, against a
real S3-compatible server on loopback; its keys never show in the task log."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from runner_support import MakeRun, log_text

from trainyard.runner.main import Runner

pytest.importorskip("moto")
from trainyard.data.testing import MotoS3  # noqa: E402

KEY_ID, SECRET = "AKIDDATACRED01", "dataCredSecret_9f9f"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoS3]:
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "TRAINYARD_S3_ENDPOINT_URL",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINYARD_DATA_RETRIES", "1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with MotoS3(buckets=["cred-bucket"]) as server:
        server.client().put_object(Bucket="cred-bucket", Key="data/a.txt", Body=b"from s3")
        yield server


def _run(make_run: MakeRun, s3: MotoS3, with_credential: bool) -> tuple[int, object]:
    creds = (
        [
            {
                "endpoint": "s3://cred-bucket",
                "access_key_id": KEY_ID,
                "access_key": SECRET,
                "region": "us-east-1",
                "override_url": s3.endpoint_url,
            }
        ]
        if with_credential
        else []
    )
    run = make_run(
        script="cp {{input:0}}/a.txt {{output}}/b.txt\n",
        inputs=[
            {"kind": "url", "name": "s3://cred-bucket/data/", "source": "s3://cred-bucket/data/"}
        ],
        outputs=[{"url": "s3://cred-bucket/out/"}],
        data_credentials=creds,
    )
    return Runner(run).execute(), run


def test_url_input_and_output_use_the_data_credential(make_run: MakeRun, s3: MotoS3) -> None:
    code, run = _run(make_run, s3, with_credential=True)
    text = log_text(run)  # type: ignore[arg-type]
    assert code == 0, text
    assert s3.keys("cred-bucket", "out/") == ["out/b.txt"]
    assert SECRET not in text and KEY_ID not in text


def test_without_it_the_endpoint_is_not_reached(make_run: MakeRun, s3: MotoS3) -> None:
    code, run = _run(make_run, s3, with_credential=False)
    assert code == 2010, log_text(run)  # type: ignore[arg-type]
