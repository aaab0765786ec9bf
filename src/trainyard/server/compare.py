"""Two workflows side by side (``trainyard workflow diff A B``, the dashboard's ``/compare``).

What differs (template values after ``default-values`` and ``--set``, labels, pool, backend,
each task's image), the final metrics of each ``metrics.jsonl`` (its ``summary`` line, else
its last), and whether the saved models are the same tensor by tensor
(:mod:`trainyard.server.tensors`). :func:`run_facts` reads one workflow; :func:`diff_runs`
compares two :class:`RunFacts`, reading only the model files it pairs: ``*.pth``/``*.pt`` and
``metrics.jsonl`` at most three folders deep in each task's current ``{{output}}``, paired by
task and path; a file reached through a link out of the output folder is left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from trainyard import spec as specapi
from trainyard.engine import machine as m
from trainyard.errors import SpecError
from trainyard.server.answers import DiffAnswer, DiffMetric, DiffModel, DiffSetting, RunHeader
from trainyard.server.dashboard import find_files, metrics_files
from trainyard.server.tensors import compare_models
from trainyard.spec.models import WorkflowSpec
from trainyard.spec.template import extract_default_values
from trainyard.store import WorkflowRecord

__all__ = [
    "RunFacts",
    "run_facts",
    "diff_runs",
    "settings_table",
    "template_values",
    "final_metrics",
    "model_files",
    "MODEL_SUFFIXES",
]

MODEL_SUFFIXES = (".pth", ".pt")
_MAX_DEPTH = 3
_MAX_METRICS_BYTES = 4 << 20
"""Read at most the last 4 MiB of a metrics file: its final line is near the end."""
_SKIP_METRICS = {"event", "time"}

RunDir = Callable[[str, int], Path]
"""(task, retry_id) -> the attempt's run folder."""


@dataclass(frozen=True)
class RunFacts:
    """One workflow as the comparison sees it.

    Attributes:
        values: template values the spec was rendered with (``default-values`` overridden by
            ``--set`` and ``--set-string``); empty when the workflow was not submitted
            through the server (its request was not kept).
        images: task name -> image (None where the spec gives none).
        metrics: ``"TASK: PATH"`` -> the final metrics of that ``metrics.jsonl``.
        models: ``"TASK: PATH"`` -> a model file under the task's output folder.
    """

    id: str
    status: str
    pool: str
    backend: str
    labels: dict[str, str]
    values: dict[str, Any]
    images: dict[str, str | None]
    metrics: dict[str, dict[str, Any]]
    models: dict[str, Path]

    def header(self) -> RunHeader:
        return {"id": self.id, "status": self.status, "pool": self.pool, "backend": self.backend}


# --------------------------------------------------------------------------- reading


def template_values(record: WorkflowRecord) -> dict[str, Any]:
    """The values a server-submitted workflow was rendered with (see :class:`RunFacts`)."""
    request = record.source.get("request")
    if not isinstance(request, dict):
        return {}
    text = request.get("spec_text") or record.spec_text
    try:
        values = dict(extract_default_values(text))
        values.update(specapi.parse_set_values(request.get("set") or []))
        values.update(specapi.parse_set_strings(request.get("set_string") or []))
    except SpecError:
        return {}
    return values


def _tail_lines(path: Path) -> list[str]:
    with path.open("rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(max(0, size - _MAX_METRICS_BYTES))
        return handle.read().decode("utf-8", errors="replace").splitlines()


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def final_metrics(path: Path) -> dict[str, Any]:
    """The last ``summary`` line of a metrics file (the trainer's), else its last JSON
    object; scalar fields only, without ``event`` and ``time``. Empty when there is none."""
    rows = []
    for line in _tail_lines(path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    summaries = [r for r in rows if r.get("event") == "summary"]
    final = (summaries or rows or [{}])[-1]
    return {k: v for k, v in final.items() if k not in _SKIP_METRICS and _scalar(v)}


def model_files(output_dir: Path) -> list[Path]:
    """Model files (``*.pth``, ``*.pt``) under ``output_dir``, at most three folders deep,
    sorted; links are not followed; bounded as ``dashboard.find_files``."""
    return find_files(output_dir, lambda name: name.endswith(MODEL_SUFFIXES), max_depth=_MAX_DEPTH)


def _inside(output: Path, path: Path) -> bool:
    """Whether ``path`` really lies in ``output``: a task may have made a folder of its
    output a link to a place elsewhere on the server's machine, which is not read."""
    try:
        return path.resolve().is_relative_to(output.resolve())
    except OSError:
        return False


def _outputs(
    state: m.WorkflowState, run_dir: RunDir
) -> tuple[dict[str, dict[str, Any]], dict[str, Path]]:
    metrics: dict[str, dict[str, Any]] = {}
    models: dict[str, Path] = {}
    for name, task in state.tasks.items():
        output = run_dir(name, task.retry_id) / "output"
        for path in (p for p in metrics_files(output) if _inside(output, p)):
            metrics[f"{name}: {path.relative_to(output)}"] = final_metrics(path)
        for path in (p for p in model_files(output) if _inside(output, p)):
            models[f"{name}: {path.relative_to(output)}"] = path
    return metrics, models


def run_facts(
    record: WorkflowRecord,
    workflow: WorkflowSpec | None,
    state: m.WorkflowState,
    run_dir: RunDir,
    backend: str,
) -> RunFacts:
    """Gather :class:`RunFacts` of one workflow (``workflow`` None: its spec no longer
    parses, images unknown)."""
    images = {t.name: t.image for t in workflow.all_tasks()} if workflow is not None else {}
    metrics, models = _outputs(state, run_dir)
    return RunFacts(
        id=record.id,
        status=state.status.value,
        pool=record.pool,
        backend=backend,
        labels=dict(record.labels),
        values=template_values(record),
        images=images,
        metrics=metrics,
        models=models,
    )


# --------------------------------------------------------------------------- comparing

_MISSING = None


def _differing(kind: str, dicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows ``{"field": "KIND.NAME", "values": [...]}`` for the names whose value (or
    presence) is not the same in every dict; a missing value is None."""
    names = list(dict.fromkeys(k for d in dicts for k in d))
    rows = []
    for name in names:
        cells = [(name in d, d.get(name, _MISSING)) for d in dicts]
        if any(c != cells[0] for c in cells):
            rows.append({"field": f"{kind}.{name}", "values": [v for _, v in cells]})
    return rows


def settings_table(runs: list[RunFacts]) -> list[dict[str, Any]]:
    """The settings that are not the same in all ``runs``, one value per run (in order):
    ``[{"field", "values": [...]}]``. ``field`` is ``pool``, ``backend``, ``set.NAME``
    (template values after ``default-values`` and ``--set``), ``label.KEY`` or
    ``image.TASK``; a value a run lacks is None. For two runs these are the rows of
    :func:`diff_runs`'s ``differences`` (the dashboard's ``/compare`` table)."""
    rows = [
        {"field": f, "values": [getattr(r, f) for r in runs]}
        for f in ("pool", "backend")
        if len({getattr(r, f) for r in runs}) > 1
    ]
    return (
        rows
        + _differing("set", [r.values for r in runs])
        + _differing("label", [r.labels for r in runs])
        + _differing("image", [r.images for r in runs])
    )


def _settings(a: RunFacts, b: RunFacts) -> list[DiffSetting]:
    return [
        {"field": row["field"], "a": row["values"][0], "b": row["values"][1]}
        for row in settings_table([a, b])
    ]


def _metric_rows(a: RunFacts, b: RunFacts) -> list[DiffMetric]:
    rows: list[DiffMetric] = []
    for file in list(a.metrics) + [f for f in b.metrics if f not in a.metrics]:
        ma, mb = a.metrics.get(file, {}), b.metrics.get(file, {})
        for name in list(ma) + [k for k in mb if k not in ma]:
            rows.append(
                {
                    "file": file,
                    "name": name,
                    "a": ma.get(name),
                    "b": mb.get(name),
                    "same": name in ma and name in mb and ma[name] == mb[name],
                }
            )
    return rows


def _model_rows(a: RunFacts, b: RunFacts) -> list[DiffModel]:
    rows: list[DiffModel] = []
    for file in list(a.models) + [f for f in b.models if f not in a.models]:
        if file not in a.models or file not in b.models:
            where = "b" if file in b.models else "a"
            rows.append({"file": file, "identical": False, "error": f"only in {where}"})
            continue
        compared = compare_models(a.models[file], b.models[file]).to_json()
        rows.append(cast("DiffModel", {"file": file, **compared}))
    return rows


def _all_identical(rows: list[DiffModel]) -> bool | None:
    """True: models on both sides, all identical; False: one differs or is on one side only;
    None: no models, or one could not be compared and none differs."""
    if not rows or any(r["identical"] is False for r in rows):
        return False if rows else None
    return None if any(r["identical"] is None for r in rows) else True


def diff_runs(a: RunFacts, b: RunFacts) -> DiffAnswer:
    """The comparison as JSON: ``{"a": {id, status, pool, backend}, "b": {...},
    "differences": [{"field", "a", "b"}], "metrics": [{"file", "name", "a", "b", "same"}],
    "models": [{"file", "identical", "tensors", "differing", "differing_count", "only_in_a",
    "only_in_b", "same_bytes", "error"}], "models_identical": true | false | null}``.

    ``field`` is ``pool``, ``backend``, ``set.NAME``, ``label.KEY`` or ``image.TASK``; a value
    missing on one side is null. Model files are paired by task and path.
    """
    models = _model_rows(a, b)
    return {
        "a": a.header(),
        "b": b.header(),
        "differences": _settings(a, b),
        "metrics": _metric_rows(a, b),
        "models": models,
        "models_identical": _all_identical(models),
    }
