"""Issue 12: a pool whose backend is not available here is refused, by name, with the
backends that are; the other pools are still served."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard import backends
from trainyard.backends.served import get_pool, load_pool_file, load_usable_pools, refused_pools
from trainyard.errors import ConfigError

POOLS = """pools:
  k8s:
    backend: tpu-pod
    node_count: 2
  made-up:
    backend: warp-drive
  spare:
    backend: local
    node_count: 1
"""


MISSING = "trainyard.backends.tpu_pod:create"
"""A registered backend whose module is not installed (every real one now is)."""


@pytest.fixture
def pools_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setitem(backends.BACKENDS, "tpu-pod", MISSING)
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS)
    return path


def test_unavailable_backends_are_refused_and_the_rest_served(pools_file: Path) -> None:
    usable, refused = load_pool_file(pools_file)
    assert sorted(usable) == ["local", "spare"]
    assert sorted(refused) == ["k8s", "made-up"]
    assert refused["k8s"].startswith(
        "pool 'k8s': backend 'tpu-pod' is not available (its "
        "module trainyard.backends.tpu_pod is not installed)"
    )
    assert "backends available: fake, kubernetes, local, slurm" in refused["k8s"]
    assert str(pools_file) in refused["k8s"]
    assert "unknown backend 'warp-drive'" in refused["made-up"]
    assert sorted(load_usable_pools(pools_file)) == ["local", "spare"]
    assert refused_pools(pools_file) == refused


def test_get_pool_names_the_reason(pools_file: Path) -> None:
    with pytest.raises(ConfigError, match="pool 'k8s': backend 'tpu-pod' is not available"):
        get_pool("k8s", pools_file)
    assert get_pool("spare", pools_file).backend == "local"


def test_unavailable_reason_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends.BACKENDS, "tpu-pod", MISSING)
    assert backends.unavailable_reason("local") is None
    assert backends.unavailable_reason("slurm") is None
    assert backends.unavailable_reason("kubernetes") is None
    assert "not installed" in (backends.unavailable_reason("tpu-pod") or "")
    assert "local" in backends.available_backends()
    assert "tpu-pod" not in backends.available_backends()
