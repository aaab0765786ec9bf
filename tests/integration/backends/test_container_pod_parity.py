"""Issue 11, images: a task in its image (``images: podman``) gets what a pod gets, as a task
in the bubblewrap sandbox does: the ``volumeMounts`` its pool allows (writable by its root,
one that cannot be made fails it at start with FAILED_START_ERROR), and a writable root of
its own that RESTART keeps and RESCHEDULE starts afresh.

Through the real engine, the local backend, the runner and podman, with the tiny busybox
image the container tests import (``local_support.busybox_image``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from local_support import busybox_image, isolation_available

from trainyard import spec
from trainyard.backends.container import probe_podman
from trainyard.engine.reconciler import Engine, Submission
from trainyard.engine.status import ExitCode, Status, WorkflowStatus
from trainyard.pools import Pool, default_local_pool
from trainyard.store import Store

TIMEOUT_S = 180

pytestmark = pytest.mark.skipif(probe_podman() is not None, reason=f"{probe_podman()}")


class PodEngine:
    """The engine on a local pool whose images run in podman (``images: podman``), with
    ``options`` added to the default local pool's; stepped by a background thread."""

    def __init__(self, home: Path, **options: Any) -> None:
        base = default_local_pool()
        self.pool = Pool(name=base.name, nodes=base.nodes, images={"*": "podman"},
                         options={**base.options, "sandbox": "bwrap", **options})
        self.engine = Engine(Store(f"sqlite:///{home / 'db.sqlite'}"), home,
                             pools={self.pool.name: self.pool})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.engine.run_forever, args=(self._stop,),
                                        daemon=True)
        self._thread.start()

    def run(self, text: str, **values: object) -> str:
        """Validate ``text`` with these ``--set`` values, submit it, wait; returns its id."""
        doc = spec.load(text, set_values=values, pool=self.pool)
        record = self.engine.submit(Submission(spec=doc.workflow, spec_text=text,
                                               user="tester", pool=self.pool))
        self.engine.wait(record.id, TIMEOUT_S)
        return record.id

    def log(self, wid: str, task: str, retry_id: int = 0) -> str:
        path = self.engine.run_dir(wid, task, retry_id) / "task.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.close()


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return busybox_image(tmp_path_factory.mktemp("image"))


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    path = tmp_path / "shared data"
    path.mkdir()
    return path


@pytest.fixture
def pods(tmp_path: Path, allowed: Path) -> Iterator[PodEngine]:
    why_not = isolation_available("bwrap", "netns")
    if why_not:
        pytest.skip(f"sandboxed isolation not available here: {why_not}")
    home = tmp_path / "home dir"
    home.mkdir()
    made = PodEngine(home, allowed_mounts=[str(allowed)])
    yield made
    made.close()


MOUNT_SPEC = """
workflow:
  name: image-mounts
  tasks:
  - name: t
    image: {{image}}
    volumeMounts:
    - "{{source}}:/mnt/shared"
    command: [sh, -c, 'ls /mnt/shared && cat /mnt/shared/in.txt && echo from-task > /mnt/shared/out.txt']
"""


def test_an_allowed_mount_is_there_and_writable_in_the_image(
    pods: PodEngine, allowed: Path, image: str
) -> None:
    """Was: the mount was not made (``ls /mnt/shared`` failed) in an image task."""
    source = allowed / "team"
    source.mkdir()
    (source / "in.txt").write_text("from-host\n")
    wid = pods.run(MOUNT_SPEC, image=image, source=str(source))
    text = pods.log(wid, "t")
    assert pods.engine.state(wid).status is WorkflowStatus.COMPLETED, text
    assert f"podman container of image {image}" in text
    assert "[t] from-host" in text
    out = source / "out.txt"
    assert out.read_text() == "from-task\n"
    assert (out.stat().st_uid, out.stat().st_gid) == (0, 0)  # as in the sandbox: host root's


def test_a_mount_that_cannot_be_made_fails_the_image_task_at_start(
    pods: PodEngine, allowed: Path, image: str
) -> None:
    missing = allowed / "not made"
    wid = pods.run(MOUNT_SPEC, image=image, source=str(missing))
    task = pods.engine.state(wid).tasks["t"]
    text = pods.log(wid, "t")
    assert task.status is Status.FAILED_START_ERROR, text
    assert task.exit_code == int(ExitCode.START_ERROR) == 3003
    assert f"volume mount {missing}:/mnt/shared: host folder {missing} does not exist" in text
    assert "[t] " not in text  # the command never ran
    assert not missing.exists()
