"""Fixtures for tests against the throwaway Slurm cluster of ``scripts/slurm-cluster.sh``,
loaded by each test module with ``pytest_plugins = ["slurm_fixtures"]`` (a plugin, not a
``conftest.py``: tests elsewhere import ``conftest`` by name, and a second one would shadow it).

Every test here is skipped, with the reason, when ``sbatch`` is not on PATH or the cluster is
not up (``scripts/slurm-cluster.sh start`` writes ``$TRAINYARD_SLURM_DIR/pools.yaml``,
default ``/tmp/trainyard-slurm``). CI (``.ci/run``) starts it before the tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster_support import EngineRunner, cluster_pool, why_no_cluster

from trainyard.pools import Pool


@pytest.fixture(scope="session")
def runner_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``TRAINYARD_HOME`` of the task runners (datasets land there), not the user's."""
    home = tmp_path_factory.mktemp("trainyard-home")
    before = os.environ.get("TRAINYARD_HOME")
    os.environ["TRAINYARD_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("TRAINYARD_HOME", None)
    else:
        os.environ["TRAINYARD_HOME"] = before


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder the engines' pools list in ``options.allowed_data_roots``, for ``file://``
    URLs of the specs (the default roots are the engine's home storage only, and the submit
    check reads ``TRAINYARD_HOME``, which is ``runner_home`` here, not the engine's home)."""
    return tmp_path_factory.mktemp("data-root")


def _with_data_root(pool: Pool, root: Path) -> Pool:
    return pool.model_copy(update={"options": {**pool.options, "allowed_data_roots": [str(root)]}})


@pytest.fixture(scope="session")
def slurm_pool() -> Pool:
    """The ``slurm-local`` pool of the running test cluster (skips without one)."""
    why = why_no_cluster()
    if why:
        pytest.skip(why)
    return cluster_pool()


@pytest.fixture(scope="session")
def slurm_engine(
    slurm_pool: Pool, runner_home: Path, data_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineRunner]:
    """An engine driving the Slurm pool from a background thread, home under a temp folder;
    its pool lists ``data_root``."""
    runner = EngineRunner(
        tmp_path_factory.mktemp("slurm-home"), _with_data_root(slurm_pool, data_root)
    )
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def local_engine(
    runner_home: Path, data_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineRunner]:
    """The same on the local backend, for side-by-side outcomes."""
    from trainyard.pools import default_local_pool

    runner = EngineRunner(
        tmp_path_factory.mktemp("local-home"), _with_data_root(default_local_pool(), data_root)
    )
    yield runner
    runner.close()


@pytest.fixture
def weird_home(tmp_path: Path) -> Path:
    """A home folder whose path needs shell quoting."""
    path = tmp_path / "it's a \"slurm\" home $HOME"
    path.mkdir()
    return path
