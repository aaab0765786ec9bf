"""``trainyard workflow submit examples/torchrun_multinode/train.yaml --pool k8s --dry-run``
with ``examples/kubernetes/pools.yaml`` as the pools file, through the real CLI path (the
CLI over HTTP to the server's own app in a thread), needing no cluster and no kubernetes
client. Its output (the rendered spec, then the group's manifests) is pinned by
``golden/cli_dry_run.txt`` with the home folder written as ``$TRAINYARD_HOME``
(``UPDATE_GOLDEN=1`` rewrites it), and every YAML document of it passes Kubernetes' schemas
in strict mode."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from k8s_support import check_golden, validate_strict
from served_cli import cli, served

REPO = Path(__file__).resolve().parents[4]
SPEC = REPO / "examples" / "torchrun_multinode" / "train.yaml"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A home holding the example pools file, its server up, the CLI pointed at it."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "examples" / "kubernetes" / "pools.yaml", home / "pools.yaml")
    with served(home, monkeypatch):
        yield home


def test_dry_run_prints_valid_manifests_of_the_seed_spec(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = cli(capsys, "workflow", "submit", str(SPEC), "--pool", "k8s", "--dry-run")
    check_golden("cli_dry_run.txt", out.replace(str(home), "$TRAINYARD_HOME"))
    manifests = out.split("# ==== group training on pool k8s\n", 1)[1]
    objects = [doc for doc in yaml.safe_load_all(manifests) if doc]
    kinds = [o["kind"] for o in objects]
    assert kinds == ["ConfigMap", "Service", "PodGroup", "Secret", "Secret", "Pod", "Pod"]
    assert validate_strict(objects) == 6
    worker = objects[-1]
    assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "master.ty-train-multi-gpu-1-training.trainyard.svc.cluster.local" in out
    assert cli(capsys, "workflow", "list", "-t", "json").strip() == "[]"
    assert not (home / "runs").exists()
