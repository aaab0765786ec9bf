"""The CLI's spec request body (``cli.request.SpecBody``, a plain dataclass: no pydantic on
the submit path, issue 15) is what the server's model (``server.schema.SpecRequest``, the
contract) reads: same fields, every body accepted unchanged, so the two cannot drift."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.cli.request import SpecBody, spec_request
from trainyard.server.schema import SpecRequest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torchrun_multinode" / "train.yaml"

_text = st.text(max_size=20)
_pairs = st.lists(st.text(max_size=10).map(lambda s: f"k={s}"), max_size=3)


def test_the_body_has_exactly_the_server_models_fields_and_defaults() -> None:
    assert [f.name for f in fields(SpecBody)] == list(SpecRequest.model_fields)
    assert SpecBody(spec_text="x").to_json() == SpecRequest(spec_text="x").model_dump()


@settings(deadline=None)  # a loaded machine must not fail it on time
@given(
    spec_text=_text,
    spec_name=_text,
    files=st.dictionaries(_text, _text, max_size=3),
    set_=_pairs,
    set_string=_pairs,
    set_env=_pairs,
    pool=st.none() | _text,
    labels=st.dictionaries(_text, _text, max_size=3),
)
def test_the_server_model_reads_every_body_unchanged(
    spec_text: str,
    spec_name: str,
    files: dict[str, str],
    set_: list[str],
    set_string: list[str],
    set_env: list[str],
    pool: str | None,
    labels: dict[str, str],
) -> None:
    body = SpecBody(
        spec_text=spec_text,
        spec_name=spec_name,
        files=files,
        set=set_,
        set_string=set_string,
        set_env=set_env,
        pool=pool,
        labels=labels,
    )
    sent = json.loads(json.dumps(body.to_json()))  # what goes over the wire
    assert SpecRequest.model_validate(sent).model_dump() == body.to_json()


def test_the_body_of_the_example_spec_is_accepted_with_its_values() -> None:
    body = spec_request(
        EXAMPLE,
        set_values=["n_gpus_per_node=1"],
        set_strings=[],
        set_env=[],
        pool="local",
        labels={"team": "a"},
    )
    model = SpecRequest.model_validate(json.loads(json.dumps(body.to_json())))
    assert model.spec_text == EXAMPLE.read_text()
    assert (model.set, model.pool, model.labels) == (["n_gpus_per_node=1"], "local", {"team": "a"})
