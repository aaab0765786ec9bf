"""``/compare``'s settings table (issue 28): what differs among two runs or more, the same
facts as ``trainyard workflow diff`` gives for two."""

from __future__ import annotations

from typing import Any

from trainyard.server.compare import RunFacts, diff_runs, settings_table


def _run(wid: str, **changes: Any) -> RunFacts:
    facts: dict[str, Any] = dict(
        id=wid,
        status="COMPLETED",
        pool="local",
        backend="local",
        labels={"team": "vision"},
        values={"lr": 0.1, "batch": 64},
        images={"fit": "ubuntu:24.04"},
        metrics={},
        models={},
    )
    facts.update(changes)
    return RunFacts(**facts)


def test_only_what_differs_with_one_value_per_run_and_none_where_missing() -> None:
    runs = [
        _run("a"),
        _run("b", values={"lr": 0.2, "batch": 64}, labels={"team": "vision", "try": "2"}),
        _run(
            "c",
            pool="slurm",
            backend="slurm",
            values={"lr": 0.4, "batch": 128},
            labels={"team": "speech"},
            images={"fit": "nvcr.io/pytorch:24.01"},
        ),
    ]
    rows = {r["field"]: r["values"] for r in settings_table(runs)}
    assert rows == {
        "pool": ["local", "local", "slurm"],
        "backend": ["local", "local", "slurm"],
        "set.lr": [0.1, 0.2, 0.4],
        "set.batch": [64, 64, 128],
        "label.team": ["vision", "vision", "speech"],
        "label.try": [None, "2", None],
        "image.fit": ["ubuntu:24.04", "ubuntu:24.04", "nvcr.io/pytorch:24.01"],
    }
    assert settings_table([_run("a"), _run("b")]) == []


def test_two_runs_give_the_rows_of_workflow_diff() -> None:
    a, b = (
        _run("a"),
        _run(
            "b",
            values={"lr": 0.2, "batch": 64, "extra": None},
            images={"fit": "ubuntu:24.04", "eval": None},
        ),
    )
    table = [
        {"field": r["field"], "a": r["values"][0], "b": r["values"][1]}
        for r in settings_table([a, b])
    ]
    assert table == diff_runs(a, b)["differences"]
    # A value present as None on one side only still differs from a missing one.
    assert {r["field"] for r in table} == {"set.lr", "set.extra", "image.eval"}
