"""``GET /api/workflow/A/diff/B`` and the dashboard's ``/compare`` page for two workflows
(issue 29), in-process over the fake backend: the settings that differ (template values
after default-values and --set, labels, pool, backend, images), the final metrics side by
side, and whether the tasks' models are identical tensor by tensor, not by file bytes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine
from trainyard.pools import NodeSpec, Pool, default_local_pool
from trainyard.server.app import create_app
from trainyard.server.auth import TokenRegistry
from trainyard.server.service import Service
from trainyard.server.tensors import compare_models
from trainyard.store import Store

SPEC = """
workflow:
  name: train
  tasks:
  - name: master
    image: {{ image }}
    command: ["echo", "{{ batch_size }}"]
default-values:
  batch_size: 32
  image: ubuntu:24.04
  seed: 0
"""

WEIGHTS = {"layer.weight": torch.arange(6.0).reshape(2, 3), "layer.bias": torch.zeros(2)}


class Env:
    def __init__(self, client: TestClient, engine: Engine, home: Path) -> None:
        self.client, self.engine = client, engine
        self.headers = {"Authorization": f"Bearer {(home / 'token').read_text().strip()}"}

    def run(self, *sets: str, pool: str | None = None, labels: dict[str, str] | None = None) -> str:
        body = {"spec_text": SPEC, "set": list(sets), "pool": pool, "labels": labels or {}}
        answer = self.client.post("/api/workflow", json=body, headers=self.headers)
        assert answer.status_code == 200, answer.text
        wid = answer.json()["id"]
        for _ in range(400):
            if (
                self.client.get(f"/api/workflow/{wid}", headers=self.headers).json()["status"]
                == "COMPLETED"
            ):
                return wid
            time.sleep(0.05)
        raise AssertionError(f"{wid} did not complete")

    def output(self, wid: str) -> Path:
        out = self.engine.run_dir(wid, "master", 0) / "output" / "models"
        out.mkdir(parents=True, exist_ok=True)
        return out

    def diff(self, a: str, b: str) -> dict:
        answer = self.client.get(f"/api/workflow/{a}/diff/{b}", headers=self.headers)
        assert answer.status_code == 200, answer.text
        return answer.json()


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[Env]:
    backend = FakeBackend(lambda launch: Outcome(0, polls=1))
    other = Pool(name="cluster", backend="slurm", nodes=[NodeSpec(name="n1")])
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool(), "cluster": other},
        backend_factory=lambda p, h: backend,
    )
    with TestClient(create_app(Service(engine), TokenRegistry(tmp_path))) as client:
        yield Env(client, engine, tmp_path)


def _snapshot(folder: Path, weights: dict[str, torch.Tensor], **extra: object) -> None:
    torch.save({"model": weights, "epochs_completed": 1, **extra}, folder / "snapshot.pth")


def _metrics(folder: Path, accuracy: float, time_s: float) -> None:
    rows = [
        {"event": "start", "seed": 0},
        {"event": "epoch", "epoch": 1, "val_accuracy": 0.5},
        {
            "event": "summary",
            "time": "2026-01-01T00:00:00",
            "final_val_accuracy": accuracy,
            "total_time_s": time_s,
            "world_size": 2,
            "workers_per_node": [1, 1],
        },
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_same_model_in_other_bytes_on_another_pool_is_identical(env: Env) -> None:
    a, b = env.run(), env.run("batch_size=32", pool="cluster", labels={"site": "hpc"})
    _snapshot(env.output(a), WEIGHTS, note="first")
    _snapshot(env.output(b), {k: v.clone() for k, v in WEIGHTS.items()}, note="other bytes")
    _metrics(env.output(a), 0.97, 10.0)
    _metrics(env.output(b), 0.97, 12.5)
    data = env.diff(a, b)
    assert data["a"]["backend"] == "local" and data["b"]["backend"] == "slurm"
    assert {r["field"]: (r["a"], r["b"]) for r in data["differences"]} == {
        "pool": ("local", "cluster"),
        "backend": ("local", "slurm"),
        "label.site": (None, "hpc"),
    }
    [model] = data["models"]
    assert model["file"] == "master: models/snapshot.pth"
    assert model["identical"] is True and model["tensors"] == 2 and model["same_bytes"] is False
    assert data["models_identical"] is True
    metrics = {r["name"]: (r["a"], r["b"], r["same"]) for r in data["metrics"]}
    assert metrics["final_val_accuracy"] == (0.97, 0.97, True)
    assert metrics["total_time_s"] == (10.0, 12.5, False)
    assert "time" not in metrics and "workers_per_node" not in metrics


def test_a_changed_set_value_and_changed_weights_show(env: Env) -> None:
    a, b = env.run(), env.run("batch_size=64", "image=busybox")
    _snapshot(env.output(a), WEIGHTS)
    changed = {**WEIGHTS, "layer.bias": torch.tensor([0.0, 1e-7])}
    _snapshot(env.output(b), changed)
    data = env.diff(a, b)
    assert {r["field"]: (r["a"], r["b"]) for r in data["differences"]} == {
        "set.batch_size": (32, 64),
        "set.image": ("ubuntu:24.04", "busybox"),
        "image.master": ("ubuntu:24.04", "busybox"),
    }
    [model] = data["models"]
    assert model["identical"] is False and model["differing"] == ["layer.bias"]
    assert data["models_identical"] is False


def test_a_model_on_one_side_only_or_none_at_all(env: Env) -> None:
    a, b = env.run(), env.run()
    assert env.diff(a, b)["models_identical"] is None  # nothing to compare
    _snapshot(env.output(a), WEIGHTS)
    data = env.diff(a, b)
    assert data["models"] == [
        {"file": "master: models/snapshot.pth", "identical": False, "error": "only in a"}
    ]
    assert data["models_identical"] is False


class Custom:
    """Pickled as a global: ``weights_only`` loading refuses it (no code runs)."""


def test_a_file_that_is_no_safe_model_is_not_compared(tmp_path: Path) -> None:
    torch.save({"model": Custom()}, tmp_path / "a.pth")
    (tmp_path / "b.pth").write_bytes((tmp_path / "a.pth").read_bytes())
    result = compare_models(tmp_path / "a.pth", tmp_path / "b.pth")
    assert result.identical is None and result.same_bytes is True and "cannot load" in result.error


def test_unknown_workflow_is_404(env: Env) -> None:
    a = env.run()
    assert env.client.get(f"/api/workflow/{a}/diff/nope-1", headers=env.headers).status_code == 404


def test_compare_page_shows_the_diff_of_two_workflows(env: Env) -> None:
    a, b = env.run(), env.run("batch_size=64")
    _snapshot(env.output(a), WEIGHTS)
    _snapshot(env.output(b), WEIGHTS)
    html = env.client.get(f"/compare?id={a}&id={b}", headers=env.headers).text
    assert "Models identical" in html and "set.batch_size" in html
    assert 'id="diff-models"' in html and "master: models/snapshot.pth" in html
    single = env.client.get(f"/compare?id={a}", headers=env.headers).text
    assert 'id="diff"' not in single


def test_a_folder_linked_out_of_the_output_is_not_read(env: Env, tmp_path: Path) -> None:
    a, b = env.run(), env.run()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _snapshot(elsewhere, WEIGHTS)
    _metrics(elsewhere, 0.5, 1.0)
    for wid in (a, b):
        output = env.output(wid).parent
        (output / "linked").symlink_to(elsewhere, target_is_directory=True)
    data = env.diff(a, b)
    assert data["models"] == [] and data["metrics"] == [] and data["models_identical"] is None


def test_same_bytes_stops_at_the_first_differing_piece(tmp_path: Path) -> None:
    from trainyard.server.tensors import same_bytes

    (tmp_path / "a").write_bytes(b"x" * 10 + b"y")
    (tmp_path / "b").write_bytes(b"x" * 10 + b"z")
    (tmp_path / "c").write_bytes(b"x" * 10 + b"y")
    (tmp_path / "short").write_bytes(b"x")
    assert same_bytes(tmp_path / "a", tmp_path / "c", piece_bytes=4)
    assert not same_bytes(tmp_path / "a", tmp_path / "b", piece_bytes=4)
    assert not same_bytes(tmp_path / "a", tmp_path / "short")
