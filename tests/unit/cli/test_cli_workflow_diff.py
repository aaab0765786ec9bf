"""``trainyard workflow diff A B`` (issue 29): it asks ``GET /api/workflow/A/diff/B`` and prints
the answer as tables, or as it is with ``-t json``, ``--format-type json`` or ``--format json``;
``-f`` is no format switch here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainyard.cli import workflow_diff
from trainyard.cli.main import main

ANSWER: dict[str, Any] = {
    "a": {"id": "train-1", "status": "COMPLETED", "pool": "local", "backend": "local"},
    "b": {"id": "train-2", "status": "COMPLETED", "pool": "slurm-rehearsal", "backend": "slurm"},
    "differences": [
        {"field": "pool", "a": "local", "b": "slurm-rehearsal"},
        {"field": "backend", "a": "local", "b": "slurm"},
        {"field": "set.batch_size", "a": 32, "b": 64},
    ],
    "metrics": [
        {
            "file": "master: models/metrics.jsonl",
            "name": "final_val_accuracy",
            "a": 0.9722,
            "b": 0.9611,
            "same": False,
        }
    ],
    "models": [
        {
            "file": "master: models/snapshot.pth",
            "identical": False,
            "tensors": 4,
            "differing": ["net.0.weight"],
            "differing_count": 1,
            "only_in_a": [],
            "only_in_b": [],
            "same_bytes": False,
            "error": "",
        }
    ],
    "models_identical": False,
}


class _StubClient:
    asked: list[tuple[str, str]] = []

    def json(self, method: str, path: str, **_kwargs: Any) -> Any:
        self.asked.append((method, path))
        return ANSWER


@pytest.fixture(autouse=True)
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> type[_StubClient]:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(workflow_diff, "Client", _StubClient)
    _StubClient.asked = []
    return _StubClient


@pytest.mark.parametrize("flag", [["-t", "json"], ["--format-type", "json"], ["--format", "json"]])
def test_json_is_the_servers_answer(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workflow", "diff", "train-1", "train-2", *flag]) == 0
    assert json.loads(capsys.readouterr().out) == ANSWER
    assert _StubClient.asked == [("GET", "/api/workflow/train-1/diff/train-2")]


def test_tables_show_where_what_differs_the_models_and_the_metrics(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["workflow", "diff", "train-1", "train-2"]) == 0
    out = capsys.readouterr().out
    assert "local / local" in out and "slurm-rehearsal / slurm" in out
    assert "set.batch_size" in out and "net.0.weight" in out and "0.9722" in out
    assert out.rstrip().endswith("models: differ")


def test_f_is_no_format_switch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workflow", "diff", "train-1", "train-2", "-f", "json"]) != 0
    assert _StubClient.asked == []
