"""The example specs validate with their defaults and with the documented --set values, and
their commands run trainyard's trainer the way each example says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainyard.errors import SpecError
from trainyard.quantity import parse_quantity
from trainyard.spec.api import load

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# Not the training kit's examples: jupyter (tests/unit/spec/test_jupyter_example.py checks it),
# own_script (a user's own train.py: tests/integration/web/test_readme_own_script_e2e.py runs
# it), kubernetes (a pools.yaml, no spec: tests/unit/backends/kubernetes checks it).
NOT_TRAINING = {"jupyter", "own_script", "kubernetes"}
SPECS = sorted(p for p in EXAMPLES.rglob("*.yaml") if p.parent.name not in NOT_TRAINING)
GiB = 1024**3
# Values an example has no default for (as in OSMO's sample: the checkpoint location).
REQUIRED = {"torchrun_reschedule": {"upload_location": "s3://bucket/reschedule"}}


def _scripts(doc) -> dict[str, str]:
    return {t.name: t.files[0].contents for t in doc.workflow.all_tasks()}


def test_every_example_has_a_spec_and_a_readme() -> None:
    folders = {p.parent.name for p in SPECS}
    assert folders == {
        "torchrun_multinode",
        "torchrun_elastic",
        "torchrun_reschedule",
        "pytorch_dist",
        "heterogeneous",
    }
    for folder in folders:
        assert len((EXAMPLES / folder / "README.md").read_text().split()) > 60


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_defaults_validate_and_fit_a_64_cpu_512_gib_node(spec: Path) -> None:
    doc = load(spec, set_values=REQUIRED.get(spec.parent.name, {}))
    tasks = doc.workflow.all_tasks()
    assert sum(t.lead for t in tasks) == 1
    for task in tasks:
        resource = doc.workflow.resource_of(task)
        assert resource.cpu <= 64 and resource.memory_bytes <= 512 * GiB and resource.gpu >= 1
        assert "-m trainyard.training.train" in task.files[0].contents
        assert "{{output}}/models/snapshot.pth" in task.files[0].contents
    assert doc.default_values.get("n_epochs") == 10


@pytest.mark.parametrize("n_nodes, n_gpus", [(2, 2), (4, 2), (3, 8)])
def test_template_scales_to_n_nodes(n_nodes: int, n_gpus: int) -> None:
    doc = load(
        EXAMPLES / "torchrun_multinode" / "train_template.yaml",
        set_values={"n_nodes": n_nodes, "n_gpus_per_node": n_gpus},
    )
    scripts = _scripts(doc)
    assert list(scripts) == ["master"] + [f"worker_{i}" for i in range(1, n_nodes)]
    for rank, script in enumerate(scripts.values()):
        assert f"--nnodes {n_nodes} --nproc_per_node {n_gpus} --node_rank {rank}" in script
        assert "--master_addr {{host:master}} --master_port 29400" in script
        assert "barrier" not in script
    assert {doc.workflow.resource_of(t).gpu for t in doc.workflow.all_tasks()} == {n_gpus}


def test_template_barrier_is_optional_and_ranked_like_torchrun() -> None:
    doc = load(
        EXAMPLES / "torchrun_multinode" / "train_template.yaml",
        set_values={"use_barrier": True, "n_nodes": 3},
    )
    for rank, script in enumerate(_scripts(doc).values()):
        barrier = script.index(
            "python -m trainyard.training.barrier --num_nodes 3 --connect {{host:master}} "
            f"--rank {rank}"
        )
        assert barrier < script.index("torchrun")


def test_two_node_spec_is_osmos_master_and_worker() -> None:
    doc = load(EXAMPLES / "torchrun_multinode" / "train.yaml")
    scripts = _scripts(doc)
    assert list(scripts) == ["master", "worker"]
    assert "--node_rank 0" in scripts["master"] and "--node_rank 1" in scripts["worker"]
    assert doc.workflow.groups[0].lead.outputs[0].dataset.path == "models"


def test_elastic_uses_a_c10d_rendezvous_on_the_master() -> None:
    script = _scripts(load(EXAMPLES / "torchrun_elastic" / "train.yaml"))["worker_1"]
    for part in (
        "--nnodes 1:2",
        "--max_restarts 3",
        "--rdzv_id {{workflow_id}}",
        "--rdzv_backend c10d",
        "--rdzv_endpoint {{host:master}}:29400",
        "--rdzv_conf is_host=0,",
    ):
        assert part in script
    assert (
        "--rdzv_conf is_host=1,"
        in _scripts(load(EXAMPLES / "torchrun_elastic" / "train.yaml"))["master"]
    )


def test_reschedule_has_no_default_upload_location() -> None:
    """A default under /tmp would be refused at submit (the pool's data roots are
    ``$TRAINYARD_HOME/storage`` by default), so the example asks for one, as OSMO's does."""
    with pytest.raises(SpecError, match="template variable 'upload_location' is not set"):
        load(EXAMPLES / "torchrun_reschedule" / "train.yaml")


def test_reschedule_maps_the_code_and_injects_one_failure() -> None:
    doc = load(
        EXAMPLES / "torchrun_reschedule" / "train.yaml", set_values=REQUIRED["torchrun_reschedule"]
    )
    group = doc.workflow.groups[0]
    assert group.ignore_nonlead_status is False
    assert all(t.action_for(3).value == "RESCHEDULE" for t in group.tasks)
    checkpoint = group.lead.checkpoint[0]
    assert checkpoint.path == "/tmp/models" and checkpoint.url.endswith("/{{workflow_id}}/models")
    assert all(t.inputs[0].url == checkpoint.url for t in group.tasks)
    script = _scripts(doc)["master"]
    assert "--error_log /tmp/training_errors.log --fail-at-epoch 5" in script
    assert "--snapshot_path /tmp/models/snapshot.pth --metrics-dir {{output}}/models" in script
    assert not re.search(r"^set -\w*e", script, re.M) and "exit 3" in script
    off = _scripts(
        load(
            EXAMPLES / "torchrun_reschedule" / "train.yaml",
            set_values={**REQUIRED["torchrun_reschedule"], "fail_at_epoch": 0},
        )
    )
    assert "--fail-at-epoch" not in off["master"]


def test_pytorch_dist_gives_each_node_its_ranks() -> None:
    doc = load(
        EXAMPLES / "pytorch_dist" / "train.yaml", set_values={"n_nodes": 3, "n_gpus_per_node": 4}
    )
    offsets = [
        int(re.search(r"--offset (\d+) --size 4", s).group(1)) for s in _scripts(doc).values()
    ]
    assert offsets == [0, 4, 8]
    assert all(
        "--world_size 12" in s and "--master_addr {{host:master}}" in s
        for s in _scripts(doc).values()
    )


def test_heterogeneous_nodes_have_2_and_1_processes() -> None:
    doc = load(EXAMPLES / "heterogeneous" / "train.yaml")
    scripts = _scripts(doc)
    assert "--nnodes 2 --nproc_per_node 2 --node_rank 0" in scripts["master"]
    assert "--nnodes 2 --nproc_per_node 1 --node_rank 1" in scripts["worker"]
    assert [doc.workflow.resource_of(t).gpu for t in doc.workflow.all_tasks()] == [2, 1]


def test_quantities_parse() -> None:  # guards the fit check above against unit mistakes
    assert parse_quantity("8Gi") == 8 * GiB
