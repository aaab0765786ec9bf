"""``examples/jupyter/jupyter.yaml`` is OSMO's JupyterLab cookbook spec
(cookbook/integration_and_tools/jupyterlab/jupyter.yaml) with only ``--allow-root`` added, and
it validates here. Its run through port-forward in a browser:
tests/integration/web/test_jupyter_port_forward.py."""

from __future__ import annotations

from pathlib import Path

from trainyard.spec.api import load

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "jupyter"
OSMO_COMMAND = (
    "jupyter lab --no-browser --ip=0.0.0.0 --port=6060 "
    "--NotebookApp.allow_remote_access=True --FileContentsManager.delete_to_trash=False"
)


def test_the_cookbook_spec_validates_with_osmos_shape() -> None:
    doc = load(EXAMPLE / "jupyter.yaml")
    [task] = doc.workflow.all_tasks()
    assert (doc.workflow.name, task.name, task.lead) == ("jupyterlab", "notebook", True)
    assert task.image.startswith("nvcr.io/nvidia/pytorch:23.10-py3@sha256:")
    assert (task.command, task.args) == (["/bin/bash"], ["/tmp/entry.sh"])
    [entry] = task.files
    assert entry.path == "/tmp/entry.sh"
    assert entry.contents.replace(" --allow-root", "") == OSMO_COMMAND
    resource = doc.workflow.resource_of(task)
    assert (resource.cpu, resource.gpu, resource.memory_bytes) == (4, 0, 10 * 1024**3)
    assert doc.workflow.timeout.exec_timeout_s == 2 * 3600


def test_its_readme_says_how_to_reach_it() -> None:
    text = (EXAMPLE / "README.md").read_text()
    assert "workflow port-forward jupyterlab-1 notebook --port 6060" in text
    assert "--allow-root" in text and "token" in text
