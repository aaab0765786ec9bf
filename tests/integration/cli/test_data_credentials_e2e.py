"""Issue 25: a DATA credential (``credential set --type DATA``) is used, as OSMO uses it,
for the url inputs and outputs on its endpoint of the user's tasks, through a real server
and an S3-compatible server on loopback; its keys appear nowhere in the home."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_e2e_support import Server

pytest.importorskip("moto")
from trainyard.data.testing import MotoS3  # noqa: E402

SECRET = "dataE2ESecret_5151"


@pytest.fixture
def s3() -> Iterator[MotoS3]:
    with MotoS3(buckets=["team-bucket"]) as server:
        server.client().put_object(Bucket="team-bucket", Key="in/a.txt", Body=b"hello s3")
        yield server


def test_url_input_and_output_on_the_credentials_endpoint(
    server: Server, s3: MotoS3, tmp_path: Path
) -> None:
    done = server.cli(
        "credential",
        "set",
        "team-s3",
        "--type",
        "DATA",
        "--payload",
        "access_key_id=AKIDE2E0001",
        f"access_key={SECRET}",
        "endpoint=s3://team-bucket",
        f"override_url={s3.endpoint_url}",
    )
    assert done.code == 0, done.err
    spec = tmp_path / "spec.yaml"
    spec.write_text("""\
workflow:
  name: data-cred
  pool: osmo
  tasks:
  - name: t
    command: [sh, -c, "cat {{input:0}}/a.txt > {{output}}/b.txt"]
    inputs: [{url: "s3://team-bucket/in/"}]
    outputs: [{url: "s3://team-bucket/out/{{workflow_id}}/"}]
""")
    workflow_id = server.submit(spec)
    data = server.wait(workflow_id)
    assert data["status"] == "COMPLETED", server.logs(workflow_id)
    assert s3.keys("team-bucket", "out/") == [f"out/{workflow_id}/b.txt"]
    found = subprocess.run(
        ["grep", "-rl", "--binary-files=text", SECRET, str(server.home)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert found == []
