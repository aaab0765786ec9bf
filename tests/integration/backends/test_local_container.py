"""Issue 11, images: where the pool says ``images: podman``, a task runs in its image as a
podman container (the runner outside, the group's namespace, exit codes, cancel), and an
image that is not present fails the task at start without pulling.

No registry is reachable here, so the tests make a tiny image themselves: Debian's static
busybox as ``/bin/busybox`` (with applet links) in an otherwise empty file system, imported
with ``podman import``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_support import (
    BUSYBOX_IMAGE,
    busybox_image,
    final,
    group_launches,
    isolation_available,
    task_log,
    wait_final,
    wait_for,
)

from trainyard.backends.base import FactKind
from trainyard.backends.local import LocalBackend
from trainyard.backends.local.container import container_name, probe_podman, rootfs_path
from trainyard.pools import default_local_pool
from trainyard.status import ExitCode

IMAGE = BUSYBOX_IMAGE

needs_podman = pytest.mark.skipif(probe_podman() is not None, reason=f"{probe_podman()}")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The busybox image, imported once (``local_support.busybox_image``)."""
    return busybox_image(tmp_path_factory.mktemp("image"))


@pytest.fixture
def podman_backend(home: Path) -> Iterator[LocalBackend]:
    why_not = isolation_available("bwrap", "netns")
    if why_not:
        pytest.skip(f"sandboxed isolation not available here: {why_not}")
    pool = default_local_pool().model_copy(update={"images": {"*": "podman"}})
    backend = LocalBackend(pool, home=home, sandbox="bwrap", network="netns", stop_grace_s=2.0)
    yield backend
    backend.stop(list(backend._attempts))


def containers_named(name: str) -> list[str]:
    done = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [line for line in done.stdout.split() if line == name]


@needs_podman
def test_a_task_runs_in_its_image(podman_backend: LocalBackend, home: Path, image: str) -> None:
    script = (
        "test -x /bin/busybox && echo has-busybox; "
        "test -e /usr/bin/python3 && echo has-python || echo no-python; "
        "test -e /etc/shadow && echo has-shadow || echo no-shadow; "  # the image's /etc
        "echo host=$(hostname) wf=$TRAINYARD_WORKFLOW_ID conf=$(cat /app/conf.txt); "
        "echo x > /tmp/mine; echo out > $TRAINYARD_OUTPUT/o.txt; "
        "touch /osmo/run/workspace/w && echo workspace-writable; exit 7"
    )
    launches = group_launches(
        podman_backend,
        home,
        "wf-img",
        {
            "t": {
                "image": image,
                "command": ["sh", "-c", script],
                "environment": {"MINE": "m"},
                "files": [{"path": "/app/conf.txt", "contents": "conf of {{workflow_id}}"}],
            }
        },
    )
    podman_backend.start_group(launches)
    fact = final(wait_final(podman_backend, [launches[0].key], timeout_s=120)[launches[0].key])
    text = task_log(launches[0])
    assert fact.kind is FactKind.EXITED and fact.exit_code == 7, text
    assert "[t] has-busybox" in text and "[t] no-python" in text
    assert "[t] no-shadow" in text  # not the sandbox's account files (sandbox.ACCOUNTS)
    assert "[t] host=t wf=wf-img conf=conf of wf-img" in text
    assert "[t] workspace-writable" in text  # was: the host root's, not writable
    assert f"podman container of image {image}" in text
    if "container root: its own writable root" in text:
        root = launches[0].run_dir / "sandbox" / "overlay" / "image" / "upper"
    else:  # podman's container layer (no own root here, the log says why), /tmp bound
        assert "container root: podman's container layer" in text, text
        root = launches[0].run_dir / "sandbox" / "root"
    assert (root / "tmp" / "mine").read_text() == "x\n"
    assert (launches[0].run_dir / "output" / "o.txt").read_text() == "out\n"
    assert "MINE" not in " ".join(_argv(launches[0].run_dir))  # values never on a command line


@needs_podman
def test_the_specs_environment_reaches_the_container_not_podman(
    podman_backend: LocalBackend, home: Path, image: str
) -> None:
    """Spec variables that podman, conmon and runc (host programs of the host's root) obey:
    Go's ``GODEBUG=inittrace=1`` makes every Go program print ``init ...`` lines, which would
    land in the task log; ``LD_PRELOAD`` of a file that is no library makes ld.so complain.
    Both must reach only the container's command (busybox: not Go; its ld.so: none)."""
    launches = group_launches(
        podman_backend,
        home,
        "wf-env",
        {
            "t": {
                "image": image,
                "command": ["sh", "-c", 'echo "godebug=$GODEBUG preload=$LD_PRELOAD"'],
                "environment": {
                    "GODEBUG": "inittrace=1",
                    "LD_PRELOAD": "/etc/hostname",
                    "CONTAINERS_STORAGE_CONF": "/nonexistent/storage.conf",
                },
            }
        },
    )
    podman_backend.start_group(launches)
    fact = final(wait_final(podman_backend, [launches[0].key], timeout_s=120)[launches[0].key])
    text = task_log(launches[0])
    assert fact.kind is FactKind.EXITED and fact.exit_code == 0, text
    assert "[t] godebug=inittrace=1 preload=/etc/hostname" in text
    assert "init internal/" not in text and "cannot be preloaded" not in text, text


@needs_podman
def test_a_container_gets_its_memory_limit_from_the_spec(
    podman_backend: LocalBackend, home: Path, image: str
) -> None:
    """``memory: 64Mi`` becomes podman's ``--memory`` (no swap beyond it): a 256 MiB buffer
    is killed by the kernel (137), where it ran before."""
    from trainyard.backends.base import TaskResources

    launches = group_launches(
        podman_backend,
        home,
        "wf-mem",
        {
            "t": {
                "image": image,
                "command": [
                    "sh",
                    "-c",
                    "dd if=/dev/zero of=/dev/null bs=256M count=1 && echo done",
                ],
            }
        },
        resources=TaskResources(memory_bytes=64 << 20),
    )
    podman_backend.start_group(launches)
    fact = final(wait_final(podman_backend, [launches[0].key], timeout_s=120)[launches[0].key])
    text = task_log(launches[0])
    assert fact.kind is FactKind.EXITED and fact.exit_code == 137, text
    assert "[t] done" not in text


PRIVILEGES = r"""
r="$TRAINYARD_OUTPUT/report"
: > "$r"
echo "uid $(id -u)" >> "$r"
cat /proc/self/uid_map | sed 's/^ */uid_map /' >> "$r"
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status >> "$r"
try() { name=$1; shift; if "$@" >/dev/null 2>&1; then echo "ALLOWED $name" >> "$r"; fi; }
try mount-tmpfs mount -t tmpfs none /mnt
try unshare-user unshare -U true
try unshare-mount unshare -m true
try chown-other sh -c "touch /tmp/c && chown 1000 /tmp/c"
try sysctl sh -c 'v=$(cat /proc/sys/kernel/core_pattern) && echo "$v" > /proc/sys/kernel/core_pattern'
echo made > "$TRAINYARD_OUTPUT/made"
echo root-writable > /bin/mine && cat /bin/mine >> "$r"  # the image's files are its root's
echo done >> "$r"
"""


@needs_podman
def test_a_containers_root_is_not_the_hosts_root(
    podman_backend: LocalBackend, home: Path, image: str
) -> None:
    """Issue 11 (images): the container ran as the host's root with podman's default
    capabilities and no user namespace. Now uid 0 inside is the host's ``nobody`` (the
    bubblewrap sandbox's mapping), with no capability and ``no_new_privs``: a file it makes in
    its output folder is ``nobody``'s on the host; ``mount``, ``unshare``, ``chown`` to
    another user and sysctls fail; the image's own root is still its to write."""
    launches = group_launches(
        podman_backend,
        home,
        "wf-img-priv",
        {
            "t": {
                "image": image,
                "command": ["sh", "/tmp/probe.sh"],
                "files": [{"path": "/tmp/probe.sh", "contents": PRIVILEGES}],
            }
        },
    )
    podman_backend.start_group(launches)
    fact = final(wait_final(podman_backend, [launches[0].key], timeout_s=120)[launches[0].key])
    text = task_log(launches[0])
    assert fact.kind is FactKind.EXITED and fact.exit_code == 0, text
    output = launches[0].run_dir / "output"
    report = (output / "report").read_text().splitlines()
    assert report[-1] == "done", (report, text)
    assert "uid 0" in report, report
    maps = [line.split()[1:] for line in report if line.startswith("uid_map ")]
    assert maps and maps[0][:2] == ["0", "65534"], report  # root inside is the host's nobody
    assert ["0", "0"] not in [m[:2] for m in maps] and not any(
        int(m[1]) <= 0 < int(m[1]) + int(m[2]) for m in maps
    ), report  # host root not mapped
    assert "CapEff:\t0000000000000000" in report and "CapBnd:\t0000000000000000" in report, report
    assert "NoNewPrivs:\t1" in report, report
    assert [line for line in report if line.startswith("ALLOWED")] == [], report
    assert "root-writable" in report, report
    made = (output / "made").stat()
    assert (made.st_uid, made.st_gid) == (65534, 65534), made


def _argv(run_dir: Path) -> list[str]:
    import json

    return json.loads((run_dir / "run.json").read_text())["sandbox"]["command_prefix"]


SERVER = "echo hello-from-$TRAINYARD_TASK_NAME | nc -l -p {port}"
CLIENT = """i=0
until nc {{{{host:server}}}} {port} > /tmp/got && [ -s /tmp/got ]; do
  i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.2
done
echo "received: $(cat /tmp/got)"
"""


@needs_podman
def test_the_group_tasks_reach_each_other_in_containers(
    podman_backend: LocalBackend, home: Path, image: str
) -> None:
    port = 22000 + os.getpid() % 20000
    launches = group_launches(
        podman_backend,
        home,
        "wf-img-nc",
        {
            "server": {"image": image, "command": ["sh", "-c", SERVER.format(port=port)]},
            "client": {
                "image": image,
                "command": ["sh", "/tmp/run.sh"],
                "files": [{"path": "/tmp/run.sh", "contents": CLIENT.format(port=port)}],
            },
        },
        barrier=True,
    )
    podman_backend.start_group(launches)
    facts = wait_final(podman_backend, [l.key for l in launches], timeout_s=120)
    assert [final(facts[l.key]).exit_code for l in launches] == [0, 0], task_log(launches[1])
    assert "[client] received: hello-from-server" in task_log(launches[1])


@needs_podman
def test_a_missing_image_is_a_start_error_without_pulling(
    podman_backend: LocalBackend, home: Path
) -> None:
    missing = "localhost/trainyard-no-such-image:never"
    launches = group_launches(
        podman_backend, home, "wf-img-missing", {"t": {"image": missing, "command": ["true"]}}
    )
    started = time.monotonic()
    podman_backend.start_group(launches)
    facts = wait_final(podman_backend, [launches[0].key], timeout_s=60)[launches[0].key]
    assert time.monotonic() - started < 60
    fact = final(facts)
    assert fact.kind is FactKind.EXITED and fact.exit_code == ExitCode.START_ERROR
    assert fact.failure == "IMAGE_PULL"  # the engine's FAILED_IMAGE_PULL (issue 25)
    assert FactKind.RUNNING not in [f.kind for f in facts]
    text = task_log(launches[0])
    assert f"image {missing!r} is not present in podman's local storage" in text


@needs_podman
def test_cancel_stops_the_container(podman_backend: LocalBackend, home: Path, image: str) -> None:
    launches = group_launches(
        podman_backend,
        home,
        "wf-img-stop",
        {"t": {"image": image, "command": ["sh", "-c", "trap '' TERM; echo up; sleep 300"]}},
    )
    podman_backend.start_group(launches)
    key = launches[0].key
    wait_for(podman_backend, key, FactKind.RUNNING, timeout_s=60)
    name = container_name(launches[0].run_dir)
    deadline = time.monotonic() + 60
    while not containers_named(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert containers_named(name) == [name]
    podman_backend.stop([key])
    fact = final(wait_final(podman_backend, [key], timeout_s=60)[key])
    assert fact.exit_code != 0
    deadline = time.monotonic() + 60
    while containers_named(name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert containers_named(name) == []
    deadline = time.monotonic() + 10
    while rootfs_path(name).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not rootfs_path(name).exists()  # nor the folder its own root was mounted at


def test_without_podman_the_log_says_the_hosts_tools_run(home: Path) -> None:
    """A pool that maps no image to podman: the image is recorded, the host's tools run,
    and the task log says so plainly."""
    why_not = isolation_available("bwrap", "netns")
    if why_not:
        pytest.skip(f"sandboxed isolation not available here: {why_not}")
    backend = LocalBackend(default_local_pool(), home=home, sandbox="bwrap", network="netns")
    launches = group_launches(
        backend,
        home,
        "wf-img-host",
        {"t": {"image": "nvcr.io/nvidia/pytorch:24.03-py3", "command": ["true"]}},
    )
    backend.start_group(launches)
    wait_final(backend, [launches[0].key], timeout_s=60)
    assert (
        "image nvcr.io/nvidia/pytorch:24.03-py3 is NOT run: this pool runs no images"
        in task_log(launches[0])
    )
