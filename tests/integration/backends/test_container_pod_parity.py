"""Issue 11, images: a task in its image (``images: podman``) gets what a pod gets, as a task
in the bubblewrap sandbox does: the ``volumeMounts`` its pool allows (writable by its root,
one that cannot be made fails it at start with FAILED_START_ERROR), and a writable root of
its own that RESTART keeps and RESCHEDULE starts afresh.

GPUs: the ``--device`` wiring with fake device nodes (no GPU here).

Through the real engine (or the local backend alone), the runner and podman, with the tiny busybox
image the container tests import (``local_support.busybox_image``).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_run import EngineRun
from local_support import (
    busybox_image,
    final,
    group_launches,
    isolation_available,
    task_log,
    wait_final,
)

from trainyard.backends.local import LocalBackend, container, container_image, isolation, tracking
from trainyard.backends.local.container import container_name, probe_podman, rootfs_path
from trainyard.backends.local.container_image import image_present, inspect_image
from trainyard.backends.local.sandbox import overlay_supported
from trainyard.pools import default_local_pool
from trainyard.status import ExitCode, Status, WorkflowStatus

pytestmark = pytest.mark.skipif(probe_podman() is not None, reason=f"{probe_podman()}")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return busybox_image(tmp_path_factory.mktemp("image"))


def why_no_own_root(image: str) -> str | None:
    """Why this machine cannot give an image task its own root (None: it can)."""
    info = inspect_image(image)
    assert info is not None, f"{image} is not in podman's storage"
    return container_image.why_no_own_root(info, overlay_supported())


@pytest.fixture
def own_root(image: str) -> None:
    """Skips (saying why) where an image task cannot get a root of its own."""
    why_not = why_no_own_root(image)
    if why_not:
        pytest.skip(f"no own root for image tasks here: {why_not}")


def committed_image(
    base: str, tag: str, changes: list[str], script: str = "echo layer-two > /layer2"
) -> str:
    """``tag``: ``base`` plus a second layer (what ``script`` does) and ``changes``
    (Dockerfile lines), made with ``podman commit`` of a container (plain podman: root, no
    user namespace, ``CAP_MKNOD`` added); made once (an earlier run's is used as it is)."""
    if image_present(tag):
        return tag
    name = f"trainyard-commit-{os.getpid()}"
    limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    changed = [arg for change in changes for arg in ("--change", change)]
    try:
        for argv in (
            [
                "podman",
                *runtime,
                "run",
                "--name",
                name,
                *limits,
                "--network",
                "none",
                "--cap-add",
                "MKNOD",
                base,
                "sh",
                "-c",
                script,
            ],
            ["podman", "commit", *changed, name, tag],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (argv, done.stderr)
    finally:
        subprocess.run(
            ["podman", "rm", "--force", "--ignore", name], capture_output=True, timeout=120
        )
    return tag


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    path = tmp_path / "shared data"
    path.mkdir()
    return path


@pytest.fixture
def pods(tmp_path: Path, allowed: Path) -> Iterator[EngineRun]:
    why_not = isolation_available("bwrap", "netns")
    if why_not:
        pytest.skip(f"sandboxed isolation not available here: {why_not}")
    home = tmp_path / "home dir"
    home.mkdir()
    made = EngineRun(home, images={"*": "podman"}, allowed_mounts=[str(allowed)])
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
    pods: EngineRun, allowed: Path, image: str
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
    pods: EngineRun, allowed: Path, image: str
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


# ---------------------------------------------------------------- GPUs


@pytest.fixture
def fake_gpu_nodes() -> Iterator[Path]:
    """Character devices named as NVIDIA's (made with mknod as copies of /dev/null, 1:3) in
    a folder the container's root may reach; never under the host's /dev, which other
    tests (and tasks) see."""
    folder = Path(tempfile.mkdtemp(prefix="trainyard-fake-dev-"))
    try:
        folder.chmod(0o755)
        (folder / "nvidia-caps").mkdir()
        (folder / "nvidia-caps").chmod(0o755)  # as /dev's, whatever the umask
        for name in ("nvidia0", "nvidiactl", "nvidia-caps/nvidia-cap1"):
            os.mknod(folder / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            (folder / name).chmod(0o666)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


GPU_PROBE = """
echo hi > {dev}/nvidia0 && cat {dev}/nvidia-caps/nvidia-cap1 && echo nodes-usable
echo visible=$CUDA_VISIBLE_DEVICES
"""


def test_an_image_task_gets_the_gpu_nodes_and_its_cuda_visible_devices(
    home: Path,
    image: str,
    fake_gpu_nodes: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The --device wiring, through the runner and podman, with fake nodes (this machine
    has no GPU: CUDA itself is not checked, nor CDI, whose argv the unit tests check)."""
    why_not = isolation_available("bwrap", "netns")
    if why_not:
        pytest.skip(f"sandboxed isolation not available here: {why_not}")
    nodes = tuple(str(fake_gpu_nodes / n) for n in ("nvidia-caps", "nvidia0", "nvidiactl"))
    monkeypatch.setattr(container, "gpu_device_nodes", lambda: nodes)
    monkeypatch.setattr(container, "cdi_gpu_names", lambda: frozenset())
    monkeypatch.setattr(tracking, "gpu_count", lambda: 1)
    pool = default_local_pool().model_copy(update={"images": {"*": "podman"}})
    backend = LocalBackend(pool, home=home, sandbox="bwrap", network="netns", stop_grace_s=2.0)
    try:
        launches = group_launches(
            backend,
            home,
            "wf-img-gpu",
            {"t": {"image": image, "command": ["sh", "-c", GPU_PROBE.format(dev=fake_gpu_nodes)]}},
            gpu_slots=[0],
        )
        backend.start_group(launches)
        fact = final(wait_final(backend, [launches[0].key], timeout_s=120)[launches[0].key])
    finally:
        backend.stop(list(backend._attempts))
    text = task_log(launches[0])
    assert fact.exit_code == 0, text
    assert "[t] nodes-usable" in text and "[t] visible=0" in text, text


# ---------------------------------------------------------------- the container's root

ROOT_SPEC = """
workflow:
  name: image-root
  tasks:
  - name: t
    image: {{image}}
    exitActions:
      {{action}}: 42
    environment:
      MARK: "{{mark}}"
    command:
    - sh
    - -c
    - |
      set -e
      if [ "$TRAINYARD_RETRY_ID" = 0 ]; then
        mkdir -p /var/tmp /app
        touch /var/tmp/$MARK
        echo app > /app/$MARK
        echo mine >> /bin/busybox-$MARK
        exit 42
      fi
      {{check}} -e /var/tmp/$MARK
      {{check}} -e /app/$MARK
      {{check}} -e /bin/busybox-$MARK
      test -x /bin/busybox
"""


def _containers_of(names: list[str]) -> list[str]:
    """Those of ``names`` that podman still knows, as containers or in its storage."""
    done = subprocess.run(
        ["podman", "ps", "-a", "--external", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [n for n in done.stdout.split() if n in names]


@pytest.mark.parametrize(
    ("action", "check"),
    [
        ("RESTART", "test"),  # the same root: every marker is still there
        ("RESCHEDULE", "test !"),  # a fresh root from the image: none is
    ],
)
def test_restart_keeps_the_containers_root_and_reschedule_starts_afresh(
    pods: EngineRun, image: str, action: str, check: str, own_root: None
) -> None:
    """Was: RESTART lost the container's own layer, so a marker under /var/tmp written by
    the first attempt was gone and the spec could never complete."""
    mark = f"trainyard-mark-{uuid.uuid4().hex[:12]}"
    wid = pods.run(ROOT_SPEC, image=image, action=action, check=check, mark=mark)
    state = pods.engine.state(wid)
    logs = pods.log(wid, "t", 0) + pods.log(wid, "t", 1)
    assert state.status is WorkflowStatus.COMPLETED, logs
    assert state.tasks["t"].retry_id == 1
    assert not os.path.lexists(f"/var/tmp/{mark}") and not os.path.lexists(f"/app/{mark}")
    names = [container_name(pods.engine.run_dir(wid, "t", r)) for r in (0, 1)]

    def left() -> list[str]:  # containers, and the folders their roots were mounted at
        return _containers_of(names) + [n for n in names if rootfs_path(n).exists()]

    deadline = time.monotonic() + 60  # removed in the background once each attempt ended
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left() == []
    if action == "RESTART":  # the first attempt's layer moved into the second's run folder
        upper = pods.engine.run_dir(wid, "t", 1) / "sandbox" / "overlay" / "image" / "upper"
        assert (upper / "var" / "tmp" / mark).exists()


DEVICE_IMAGE = "localhost/trainyard-test-devnode:2"


@pytest.fixture(scope="module")
def device_image(image: str) -> str:
    """The busybox image plus ``/zero``: a world-writable character device node 1:5 (the
    kernel's zero device; harmless, as a node of the host's disk would not be)."""
    return committed_image(image, DEVICE_IMAGE, [], "busybox mknod -m 666 /zero c 1 5")


DEVICE_SPEC = """
workflow:
  name: image-devnode
  tasks:
  - name: t
    image: {{image}}
    command: [sh, -c, 'ls -l /zero && head -c 3 /zero > /tmp/z && echo OPENED']
"""


def test_a_device_node_the_image_carries_cannot_be_opened(
    pods: EngineRun, device_image: str, own_root: None
) -> None:
    """Found on the way: in podman's own layers here (no storage.conf asking ``nodev``) a
    task could open any device node its image carries; its own root is mounted nodev."""
    wid = pods.run(DEVICE_SPEC, image=device_image)
    text = pods.log(wid, "t")
    assert "container root: its own writable root" in text, text
    assert "[t] crw-rw-rw-" in text  # the node is there...
    assert "[t] OPENED" not in text and "Permission denied" in text, text  # ...and unusable


LAYERED_IMAGE = "localhost/trainyard-test-layered:1"


@pytest.fixture(scope="module")
def layered_image(image: str) -> str:
    """The busybox image plus a second layer and an ``ENV``."""
    return committed_image(
        image, LAYERED_IMAGE, ["ENV GREETING=from-image", "ENV IMAGE_ONLY=image-only"]
    )


LAYERED_SPEC = """
workflow:
  name: image-layers
  tasks:
  - name: t
    image: {{image}}
    environment:
      GREETING: from-spec
    command: [sh, -c, 'cat /layer2 && echo "env $GREETING $IMAGE_ONLY" && echo changed > /layer2']
"""


def test_a_layered_image_is_stacked_with_its_env_and_the_task_env_wins(
    pods: EngineRun, layered_image: str, own_root: None
) -> None:
    wid = pods.run(LAYERED_SPEC, image=layered_image)
    text = pods.log(wid, "t")
    assert pods.engine.state(wid).status is WorkflowStatus.COMPLETED, text
    assert "container root: its own writable root" in text
    assert "[t] layer-two" in text and "[t] env from-spec image-only" in text, text
    upper = pods.engine.run_dir(wid, "t", 0) / "sandbox" / "overlay" / "image" / "upper"
    assert (upper / "layer2").read_text() == "changed\n"  # the image's layer is untouched:
    again = pods.run(LAYERED_SPEC, image=layered_image)
    assert "[t] layer-two" in pods.log(again, "t")


def test_without_an_own_root_the_container_layer_runs_and_the_log_says_so(
    home: Path,
    image: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the runner cannot mount overlayfs (a server that is not root), podman's own
    container layer is the root, as before: the task runs, and its log says RESTART does
    not keep that root."""
    why_not = isolation_available("bwrap", "netns")
    if why_not:
        pytest.skip(f"sandboxed isolation not available here: {why_not}")
    monkeypatch.setattr(isolation, "overlay_supported", lambda: False)
    pool = default_local_pool().model_copy(update={"images": {"*": "podman"}})
    backend = LocalBackend(pool, home=home, sandbox="bwrap", network="netns", stop_grace_s=2.0)
    try:
        launches = group_launches(
            backend,
            home,
            "wf-img-layer",
            {"t": {"image": image, "command": ["sh", "-c", "echo x > /tmp/m && cat /tmp/m"]}},
        )
        backend.start_group(launches)
        fact = final(wait_final(backend, [launches[0].key], timeout_s=120)[launches[0].key])
    finally:
        backend.stop(list(backend._attempts))
    text = task_log(launches[0])
    assert fact.exit_code == 0 and "[t] x" in text, text
    assert (
        "container root: podman's container layer, which RESTART does NOT keep (the "
        "runner cannot mount overlayfs here (needs root))"
    ) in text


USER_IMAGE = "localhost/trainyard-test-user:1"

USER_SPEC = """
workflow:
  name: image-user
  tasks:
  - name: t
    image: {{image}}
    command: [sh, -c, 'echo "uid $(id -u)"']
"""


@pytest.fixture(scope="module")
def user_image(image: str) -> str:
    """The busybox image with ``USER 1000`` (an id its container does not map)."""
    return committed_image(image, USER_IMAGE, ["USER 1000"])


def test_an_image_user_that_is_not_root_is_said_plainly(
    pods: EngineRun, user_image: str, own_root: None
) -> None:
    """Only uid 0 is mapped: with its own root the command runs as root and the log says the
    image's USER is not used, never silently."""
    wid = pods.run(USER_SPEC, image=user_image)
    text = pods.log(wid, "t")
    assert pods.engine.state(wid).status is WorkflowStatus.COMPLETED, text
    assert "[t] uid 0" in text
    assert "image USER '1000' is not used: the command runs as root inside" in text


def test_without_an_own_root_an_image_user_that_is_not_root_fails_at_start(
    home: Path,
    user_image: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With podman's container layer podman would start it as that unmapped user (and
    fail with runc's own words); it fails at start with a line saying why instead."""
    why_not = isolation_available("bwrap", "netns")
    if why_not:
        pytest.skip(f"sandboxed isolation not available here: {why_not}")
    monkeypatch.setattr(isolation, "overlay_supported", lambda: False)
    pool = default_local_pool().model_copy(update={"images": {"*": "podman"}})
    backend = LocalBackend(pool, home=home, sandbox="bwrap", network="netns", stop_grace_s=2.0)
    try:
        launches = group_launches(
            backend,
            home,
            "wf-img-user",
            {"t": {"image": user_image, "command": ["sh", "-c", "echo ran"]}},
        )
        backend.start_group(launches)
        fact = final(wait_final(backend, [launches[0].key], timeout_s=120)[launches[0].key])
    finally:
        backend.stop(list(backend._attempts))
    text = task_log(launches[0])
    assert fact.exit_code == ExitCode.START_ERROR, text
    assert f"image '{user_image}' runs as USER '1000', but uid 0 is the only id mapped" in text
    assert "[t] ran" not in text


LINKED_TMP_IMAGE = "localhost/trainyard-test-tmplink:1"


def test_an_image_whose_tmp_is_a_link_keeps_it(pods: EngineRun, image: str, own_root: None) -> None:
    """The runner gives the container's root its ``/tmp`` and ``/etc`` without following a
    link: an image's own ``/tmp -> /var/tmp`` is left as it is, not refused."""
    linked = committed_image(
        image,
        LINKED_TMP_IMAGE,
        [],
        "mkdir -p /var/tmp && chmod 1777 /var/tmp && ln -s /var/tmp /tmp",
    )
    spec = USER_SPEC.replace("echo \"uid $(id -u)\"", "echo x > /tmp/m && cat /var/tmp/m")
    wid = pods.run(spec, image=linked)
    text = pods.log(wid, "t")
    assert pods.engine.state(wid).status is WorkflowStatus.COMPLETED, text
    assert "[t] x" in text


MAPPED_USER_IMAGE = "localhost/trainyard-test-user:2"
ID_BASES = (3_000_000, 3_100_000)  # no user of this machine has such ids
MAPPED_USER_SPEC = """
workflow:
  name: image-mapped-user
  tasks:
  - name: t
    image: {{image}}
    command:
    - sh
    - -c
    - |
      echo "ids $(id -u) $(id -g)"
      stat -c 'home %u %g' /home/app/f
      echo more >> /home/app/f && echo appended
      echo out > $TRAINYARD_OUTPUT/o && echo wrote-output
      echo t > /tmp/t && echo wrote-tmp
      mkdir /app 2>/dev/null && echo MADE-APP
      true
"""


def test_with_a_lent_id_range_the_image_runs_as_its_user(
    pods: EngineRun, image: str, own_root: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11, images, item 4: with ``trainyard`` ranges in /etc/subuid and /etc/subgid
    (here given to the backend directly, this machine's files are left alone) the container
    maps its ids 1..65535 too: an image whose USER is 1000 runs as 1000, owns the image's
    files of 1000, writes its output folder (owned by that host id), and cannot write the
    root's ``/`` (a pod's rule)."""
    made = committed_image(
        image,
        MAPPED_USER_IMAGE,
        ["USER 1000"],
        "mkdir -p /home/app && echo mine > /home/app/f && chown -R 1000:1000 /home/app",
    )
    monkeypatch.setattr(container_image, "task_id_bases", lambda: ID_BASES)
    wid = pods.run(MAPPED_USER_SPEC, image=made)
    text = pods.log(wid, "t")
    assert pods.engine.state(wid).status is WorkflowStatus.COMPLETED, text
    assert "[t] ids 1000 0" in text and "[t] home 1000 1000" in text, text
    for line in ("appended", "wrote-output", "wrote-tmp"):
        assert f"[t] {line}" in text, text
    assert "MADE-APP" not in text and "is not used" not in text
    out = pods.engine.run_dir(wid, "t", 0) / "output" / "o"
    assert (out.stat().st_uid, out.stat().st_gid) == (ID_BASES[0] + 999, 65534)
    upper = pods.engine.run_dir(wid, "t", 0) / "sandbox" / "overlay" / "image" / "upper"
    copied = (upper / "home" / "app" / "f").stat()
    assert (copied.st_uid, copied.st_gid) == (ID_BASES[0] + 999, ID_BASES[1] + 999)
