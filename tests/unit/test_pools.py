"""Pools: the pools file, and strict pools that declare this machine's real capacity."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest

from trainyard import pools
from trainyard.errors import ConfigError, SpecError
from trainyard.pools import load_pools
from trainyard.spec.api import load


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    monkeypatch.setattr(pools, "real_gpu_count", lambda: 2)  # no GPU here: pretend two
    return tmp_path


def _pools_file(home: Path, text: str) -> Path:
    path = home / "pools.yaml"
    path.write_text(text)
    return path


def test_a_strict_pool_is_one_node_with_this_machines_capacity(home: Path) -> None:
    path = _pools_file(
        home,
        "pools:\n  mine:\n    strict: true\n    node: {platform: box, cpu: 512, memory: 9Ti}\n",
    )
    (node,) = load_pools(path)["mine"].nodes
    assert (node.name, node.platform) == ("mine-0", "box")
    assert node.cpu == len(os.sched_getaffinity(0))  # what is written is replaced
    assert node.gpu == 2
    assert node.memory_bytes == psutil.virtual_memory().total
    assert node.storage_bytes == shutil.disk_usage(home).total


def test_a_rehearsal_pool_keeps_what_it_declares(home: Path) -> None:
    path = _pools_file(home, "pools:\n  big:\n    node: {cpu: 512}\n")
    nodes = load_pools(path)["big"].nodes
    assert len(nodes) == 4 and {n.cpu for n in nodes} == {512}


def test_a_strict_local_pool_of_several_nodes_is_refused(home: Path) -> None:
    path = _pools_file(home, "pools:\n  mine:\n    strict: true\n    node_count: 2\n")
    with pytest.raises(ConfigError, match="exactly one node"):
        load_pools(path)


def test_a_strict_cluster_pool_keeps_its_declared_nodes(home: Path) -> None:
    path = _pools_file(
        home,
        "pools:\n  hpc:\n    strict: true\n    backend: slurm\n"
        "    nodes:\n    - {name: a, cpu: 96}\n    - {name: b, cpu: 96}\n",
    )
    nodes = load_pools(path)["hpc"].nodes
    assert [(n.name, n.cpu) for n in nodes] == [("a", 96), ("b", 96)]


def test_a_spec_asking_more_than_the_machine_is_refused_on_a_strict_pool(home: Path) -> None:
    strict = load_pools(_pools_file(home, "pools:\n  mine:\n    strict: true\n"))["mine"]
    cpus = int(strict.nodes[0].cpu)
    spec = (
        "workflow:\n  name: big\n  resources:\n    default:\n"
        f"      cpu: {cpus + 1}\n      gpu: 3\n"
        "  tasks:\n  - name: t\n    command: [\"true\"]\n"
    )
    load(spec)  # fits the rehearsal pool `local`
    with pytest.raises(SpecError) as caught:
        load(spec, pool=strict)
    text = str(caught.value)
    assert f"asks for {cpus + 1}" in text and f"has {cpus}" in text and "'mine'" in text
    assert "asks for 3 GPUs" in text and "has 2 GPUs" in text


def test_a_pools_default_exit_actions_are_osmos_and_cover_service_codes(home: Path) -> None:
    """Issue 26: OSMO's pool field ``default_exit_actions`` (action -> codes, any code
    0-4000, service codes such as 3001 and 3005 included)."""
    path = _pools_file(
        home,
        "pools:\n  k8s:\n    backend: kubernetes\n"
        "    default_exit_actions: {RESCHEDULE: '3001,3005', COMPLETE: 0-1}\n",
    )
    assert load_pools(path)["k8s"].default_exit_actions == {
        "RESCHEDULE": "3001,3005",
        "COMPLETE": "0-1",
    }


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("{RETRY: '3001'}", "RETRY"),
        ("{RESCHEDULE: 'x'}", "'x'"),
        ("{RESCHEDULE: '3001-9999'}", "9999"),
        ("{RESCHEDULE: '9-3'}", "9-3"),
    ],
)
def test_a_bad_default_exit_action_names_the_pool_and_what_to_write(
    home: Path, body: str, said: str
) -> None:
    path = _pools_file(home, f"pools:\n  k8s:\n    default_exit_actions: {body}\n")
    with pytest.raises(ConfigError, match="pool 'k8s'") as caught:
        load_pools(path)
    assert said in str(caught.value) and "default_exit_actions" in str(caught.value)
