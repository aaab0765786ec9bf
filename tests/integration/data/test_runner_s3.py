"""The task runner against S3 (moto on loopback): a failed upload exits 2012 and creates no
dataset version, a failed download exits 2010, credentials stay out of the task log."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_support import execute, exit_event, log_text, make_run, run_after_puts, tree

from trainyard.data import DatasetStore
from trainyard.data.testing import MotoS3, TcpProxy

SECRET = "Sup3r-Secret-Access-Key"


def test_dataset_output_to_s3_and_input_back(
    tmp_path: Path, s3_env: MotoS3, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_DATASET_URL", f"s3://my-bucket/{prefix}/datasets")
    writer = make_run(tmp_path, "echo w > {{output}}/w.pt\n", outputs=[{"dataset": {"name": "m"}}])
    assert execute(writer) == 0
    reader = make_run(
        tmp_path,
        "cat {{input:0}}/w.pt\n",
        task="t2",
        inputs=[{"kind": "dataset", "name": "m", "source": "m:latest"}],
    )
    assert execute(reader) == 0
    assert tree(reader.input_path(0)) == {"w.pt": "w\n"}


def test_upload_failing_midway_exits_2012_and_creates_no_version(
    tmp_path: Path, s3_env: MotoS3, proxy: TcpProxy, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_url = f"s3://my-bucket/{prefix}/datasets"
    monkeypatch.setenv("TRAINYARD_DATASET_URL", store_url)
    monkeypatch.setenv("TRAINYARD_S3_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    run = make_run(
        tmp_path,
        "for i in $(seq 1 12); do echo $i > {{output}}/f$i.txt; done\n",
        outputs=[{"dataset": {"name": "results"}}],
    )
    run_after_puts(monkeypatch, 3, proxy.stop)  # the store goes away after 3 files
    assert execute(run) == 2012
    code, message = exit_event(run)
    assert code == 2012 and "output to results" in message
    assert ".txt" in message and "EndpointConnectionError" in message  # the file and the cause
    assert SECRET not in log_text(run)
    monkeypatch.setenv("TRAINYARD_S3_ENDPOINT_URL", s3_env.endpoint_url)
    assert DatasetStore(store_url).versions("results") == []


def test_an_empty_s3_prefix_is_an_empty_input(tmp_path: Path, s3_env: MotoS3, prefix: str) -> None:
    run = make_run(
        tmp_path,
        "echo ran\n",
        inputs=[{"kind": "url", "name": "u", "source": f"s3://my-bucket/{prefix}/nothing/"}],
    )
    assert execute(run) == 0
    assert f"s3://my-bucket/{prefix}/nothing/: nothing there yet" in log_text(run)
    assert "[t1] ran" in log_text(run)


def test_a_missing_s3_bucket_exits_2010_naming_it(tmp_path: Path, s3_env: MotoS3) -> None:
    run = make_run(
        tmp_path,
        "echo ran\n",
        inputs=[{"kind": "url", "name": "u", "source": "s3://no-such-bucket-trainyard/x/"}],
    )
    assert execute(run) == 2010
    assert "s3://no-such-bucket-trainyard/x" in log_text(run)
    assert "[t1] ran" not in log_text(run)


@pytest.mark.usefixtures("home")
def test_url_credentials_never_reach_the_task_log(tmp_path: Path) -> None:
    url = "http://alice:hunter2-pass@127.0.0.1:9/data/?X-Amz-Signature=abcdef123456"
    run = make_run(
        tmp_path,
        "echo ran\n",
        inputs=[{"kind": "url", "name": url, "source": url}],
        outputs=[{"url": url}],
    )
    assert execute(run) == 2010
    text = log_text(run) + exit_event(run)[1]
    assert "hunter2-pass" not in text and "abcdef123456" not in text
    assert "127.0.0.1:9" in text  # the URL is still named, its secrets masked
