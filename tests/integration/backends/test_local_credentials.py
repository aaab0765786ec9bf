"""Issue 25: a task's credentials on the local backend's podman pools and in its no-sandbox
fallback: the mapping form as variables (never on podman's command line), the path form as
0600 files of the task's own inside its root, removed when the attempt ends; nothing in
run.json once the runner has read it."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_support import (
    busybox_image,
    final,
    group_launches,
    isolation_available,
    task_log,
    wait_final,
)

from trainyard.backends.base import FactKind
from trainyard.backends.local import LocalBackend
from trainyard.backends.local.container import probe_podman
from trainyard.pools import default_local_pool

SECRET = "podmanSecret_4a4a_value"
FILED = "fileSecret_b7b7_value"
SCRIPT = (
    "echo env=$(printf %s \"$HF_TOKEN\" | busybox sha256sum | busybox cut -c1-16); "
    "echo file=$(busybox sha256sum < /root/.creds/token | busybox cut -c1-16); "
    "echo mode=$(stat -c %a /root/.creds/token) owner=$(stat -c %u /root/.creds/token); "
    "echo me=$(id -u)"
)
CREDENTIALS = [
    {"name": "hf", "env": {"HF_TOKEN": "token"}, "values": {"token": SECRET}},
    {"name": "gh", "path": "/root/.creds", "values": {"token": FILED}},
]


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _grep(folder: Path, needle: str) -> list[str]:
    done = subprocess.run(
        ["grep", "-rl", "--binary-files=text", needle, str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.split()


@pytest.fixture
def podman_backend(home: Path) -> Iterator[LocalBackend]:
    if probe_podman() is not None:
        pytest.skip(str(probe_podman()))
    why_not = isolation_available("bwrap", "netns")
    if why_not:
        pytest.skip(f"sandboxed isolation not available here: {why_not}")
    pool = default_local_pool().model_copy(update={"images": {"*": "podman"}})
    backend = LocalBackend(pool, home=home, sandbox="bwrap", network="netns", stop_grace_s=2.0)
    yield backend
    backend.stop(list(backend._attempts))


def test_a_podman_task_gets_both_forms(
    podman_backend: LocalBackend, home: Path, tmp_path: Path
) -> None:
    image = busybox_image(tmp_path)
    launches = group_launches(
        podman_backend,
        home,
        "wf-cred",
        {"t": {"image": image, "command": ["sh", "-c", SCRIPT], "credentials": CREDENTIALS}},
    )
    podman_backend.start_group(launches)
    fact = final(wait_final(podman_backend, [launches[0].key], timeout_s=120)[launches[0].key])
    text = task_log(launches[0])
    assert fact.kind is FactKind.EXITED and fact.exit_code == 0, text
    assert f"env={_digest(SECRET)}" in text and f"file={_digest(FILED)}" in text, text
    assert "mode=600" in text
    owner = text.split("owner=")[1].split()[0]
    assert owner == text.split("me=")[1].split()[0]  # the task's own file
    assert _grep(home, SECRET) == [] and _grep(home, FILED) == []


def test_the_no_sandbox_fallback_gets_both_forms(home: Path) -> None:
    backend = LocalBackend(
        default_local_pool(), home=home, sandbox="none", network="loopback", stop_grace_s=2.0
    )
    script = SCRIPT.replace("busybox ", "")
    launches = group_launches(
        backend,
        home,
        "wf-cred2",
        {"t": {"command": ["sh", "-c", script], "credentials": CREDENTIALS}},
    )
    try:
        backend.start_group(launches)
        fact = final(wait_final(backend, [launches[0].key], timeout_s=60)[launches[0].key])
    finally:
        backend.stop(list(backend._attempts))
    text = task_log(launches[0])
    assert fact.kind is FactKind.EXITED and fact.exit_code == 0, text
    assert f"env={_digest(SECRET)}" in text and f"file={_digest(FILED)}" in text, text
    assert (
        not Path("/root/.creds/token").exists() or Path("/root/.creds/token").read_text() != FILED
    )  # in its private root, not the host's
    assert _grep(home, SECRET) == [] and _grep(home, FILED) == []
