"""``cli.request.SpecBody``, the CLI's request body built without pydantic (issue 15), has the
fields and defaults of the server's ``server.schema.SpecRequest``, which accepts it as is."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainyard.cli.request import SpecBody, spec_request
from trainyard.server.schema import SpecRequest


def test_the_body_has_the_server_models_fields_and_defaults() -> None:
    ours = {f.name for f in dataclasses.fields(SpecBody)}
    assert ours == set(SpecRequest.model_fields)
    assert SpecBody(spec_text="x").to_json() == SpecRequest(spec_text="x").model_dump()


def test_the_server_model_reads_a_built_body_unchanged(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text("echo hi\n")
    spec = tmp_path / "my spec.yaml"
    spec.write_text("workflow:\n  name: w\n  tasks:\n  - name: t\n    image: ubuntu\n"
                    "    command: [bash, /tmp/run.sh]\n"
                    "    files:\n    - {path: /tmp/run.sh, localpath: run.sh}\n")
    body = spec_request(spec, set_values=["a=1"], set_strings=["b=2"], set_env=["C=3"],
                        pool="local", labels={"team": "x"}).to_json()
    assert SpecRequest.model_validate(body).model_dump() == body
    assert body["files"] == {"run.sh": "echo hi\n"} and body["spec_name"] == str(spec)
