"""Issue 25: on an ``images: podman`` pool a task whose image podman cannot find ends
FAILED_IMAGE_PULL (OSMO's status), its reason naming the image, not FAILED_START_ERROR."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_run import EngineRun, require_bwrap

from trainyard.backends.container import probe_podman
from trainyard.status import Status

MISSING = "localhost/trainyard-no-such-image:never"


def test_a_missing_image_is_failed_image_pull(tmp_path: Path) -> None:
    require_bwrap()
    if probe_podman() is not None:
        pytest.skip(str(probe_podman()))
    run = EngineRun(tmp_path, images={"*": "podman"})
    try:
        wid = run.run(f"""\
workflow:
  name: no-image
  tasks:
  - name: t
    image: {MISSING}
    command: ["true"]
""")
        task = run.engine.state(wid).tasks["t"]
        assert task.status is Status.FAILED_IMAGE_PULL, (task, run.log(wid, "t"))
        assert MISSING in (task.failure_reason or "")
        assert run.engine.store.get_workflow(wid).status == "FAILED"
    finally:
        run.close()
