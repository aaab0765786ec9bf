"""Helpers for the Kubernetes backend's tests: launches of a gang, golden files, and
validation of manifests against Kubernetes' OpenAPI schemas (PyPI ``kubernetes-validate``,
strict mode: an unknown field is an error) for several Kubernetes minor versions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from trainyard.backends.base import TaskKey, TaskLaunch, TaskResources
from trainyard.pools import NodeSpec, Pool

GOLDEN = Path(__file__).parent / "golden"
HOME = Path("/srv/trainyard home")
GiB = 1024**3
SCHEMA_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")
"""Kubernetes minor versions every built-in manifest is validated against (those that the
installed kubernetes-validate ships, newest three; see ``schema_versions``)."""


def launches(
    tasks: dict[str, TaskResources],
    *,
    workflow_id: str = "train-multi-gpu-1",
    group: str = "training",
    retry_id: int = 0,
    exec_timeout_s: float | None = None,
    image: str | None = "nvcr.io/nvidia/pytorch:24.03-py3",
    node: str = "gpu-node-1",
    **run_fields: Any,
) -> list[TaskLaunch]:
    """One launch per task of a gang, run folders under ``HOME/runs``."""
    names = list(tasks)
    out = []
    for index, (name, res) in enumerate(tasks.items()):
        run_dir = HOME / "runs" / workflow_id / name / str(retry_id)
        run: dict[str, Any] = {
            "workflow_id": workflow_id,
            "group": group,
            "task": name,
            "retry_id": retry_id,
            "lead": index == 0,
            "lead_task": names[0],
            "image": image,
            "command": ["bash", "/tmp/run.sh"],
            "hosts": {n: n for n in names},
            "files": [
                {"path": "/tmp/run.sh", "contents": "set -ex\necho {{host:%s}}\n" % names[0]}
            ],
            "group_tasks": names,
            "task_index": index,
            "run_dir": str(run_dir),
            "barrier": {
                "enabled": len(names) > 1,
                "tasks": names,
                "folder": str(HOME / "runs" / workflow_id / "_barrier" / group / "0"),
            },
            **run_fields,
        }
        out.append(
            TaskLaunch(
                key=TaskKey(workflow_id, name, retry_id),
                group=group,
                node=node,
                run_dir=run_dir,
                run=run,
                resources=res,
                exec_timeout_s=exec_timeout_s,
            )
        )
    return out


def pool(options: dict[str, Any] | None = None, **fields: Any) -> Pool:
    """A Kubernetes pool of two GPU nodes of platform ``dgx-h100``."""
    nodes = [NodeSpec(name=f"gpu-node-{i}", platform="dgx-h100") for i in (1, 2)]
    return Pool(name="k8s", backend="kubernetes", nodes=nodes, options=options or {}, **fields)


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with ``golden/<name>``; ``UPDATE_GOLDEN=1`` rewrites the file."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(), f"{name} differs from its golden file (UPDATE_GOLDEN=1)"


def schema_versions() -> list[str]:
    """``SCHEMA_VERSIONS`` that the installed kubernetes-validate has schemas for (at least
    two, else the test fails: the check would be hollow)."""
    pytest.importorskip("kubernetes_validate")
    from kubernetes_validate.utils import all_versions

    have = set(all_versions())
    found = [v for v in SCHEMA_VERSIONS if v in have]
    assert len(found) >= 2, f"kubernetes-validate has schemas for {sorted(have)[-5:]} only"
    return found


def validate_strict(objects: list[dict[str, Any]]) -> int:
    """Validate each built-in object (apiVersion v1 and the like; PodGroups are CRDs, whose
    schemas the package does not have) for every version of ``schema_versions``, strict.
    Returns how many objects were validated per version. Raises the package's
    ValidationError with the object's kind and name."""
    import kubernetes_validate as kv

    built_in = [o for o in objects if o["kind"] != "PodGroup"]
    for version in schema_versions():
        for obj in built_in:
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as exc:
                raise AssertionError(
                    f"{obj['kind']} {obj['metadata']['name']} is not valid "
                    f"for Kubernetes {version}: {exc}"
                ) from exc
    return len(built_in)
