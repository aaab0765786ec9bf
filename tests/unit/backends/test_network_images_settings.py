"""Issue 11, network and images, without processes: the pasta and podman command lines (what
they must never allow), the pool settings, the submission check for hostNetwork, the
runner's container hooks (environment by name, start error) and the launch requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainyard import spec
from trainyard.backends.base import TaskKey, TaskLaunch
from trainyard.backends.images import image_note, runtime_for
from trainyard.backends.local import Isolation, LocalBackend
from trainyard.backends.local import backend as local_mod
from trainyard.backends.local import request as local_request
from trainyard.backends.local.container import (
    ContainerPlan,
    container_mounts,
    container_name,
    podman_argv,
    probe_podman,
)
from trainyard.backends.local.netns import EGRESS_ADDRESS, GroupNetwork, pasta_argv
from trainyard.backends.local.sandbox import hosts_file_text
from trainyard.errors import ConfigError
from trainyard.pools import Pool, default_local_pool, load_pools
from trainyard.runfile import TaskRun
from trainyard.runner.main import Runner
from trainyard.runner.report import read_events
from trainyard.status import ExitCode

# ---------------------------------------------------------------- pasta


@pytest.mark.parametrize("as_root", [True, False])
def test_pasta_forwards_no_port_either_way_and_maps_no_gateway(as_root: bool) -> None:
    argv = pasta_argv("/proc/self/fd/5", as_root=as_root)
    assert argv[:4] == ["setpriv", "--pdeathsig", "KILL", "--"]
    for flag in ("-t", "-u", "-T", "-U"):  # no host port in, no namespace port to the host
        assert argv[argv.index(flag) + 1] == "none"
    assert "--no-map-gw" in argv and "-f" in argv
    assert argv[argv.index("-a") + 1] == EGRESS_ADDRESS
    assert argv[-2:] == ["--netns", "/proc/self/fd/5"]
    assert ("--runas" in argv) is as_root
    assert pasta_argv("/proc/self/fd/5", as_root=False, userns="/proc/self/fd/6")[-4:] == [
        "--userns",
        "/proc/self/fd/6",
        "--netns",
        "/proc/self/fd/5",
    ]


# ---------------------------------------------------------------- pools and the spec check


def test_pool_settings_and_the_images_shorthand(tmp_path: Path) -> None:
    pool = default_local_pool()
    assert pool.egress is True and pool.allow_host_network is False
    path = tmp_path / "pools.yaml"
    path.write_text(
        "pools:\n  iso:\n    images: podman\n    egress: false\n    allow_host_network: true\n"
    )
    iso = load_pools(path)["iso"]
    assert iso.images == {"*": "podman"} and not iso.egress and iso.allow_host_network
    assert runtime_for("nvcr.io/nvidia/pytorch:24.03-py3", iso.images) == "podman"
    path.write_text("pools:\n  typo:\n    egres: false\n")
    with pytest.raises(ConfigError, match="egres"):
        load_pools(path)


HOSTNET = """workflow:
  name: w
  tasks:
  - name: t
    command: [x]
    hostNetwork: true
"""


def test_host_network_is_refused_at_submission_where_the_pool_does_not_allow_it() -> None:
    [problem] = spec.validate(HOSTNET, pool=default_local_pool())
    assert problem.path == "workflow.tasks[0].hostNetwork"
    assert "hostNetwork: true is not allowed on pool 'local'" in problem.message
    assert "allow_host_network: true" in problem.message
    allowed = default_local_pool().model_copy(update={"allow_host_network": True})
    assert spec.validate(HOSTNET, pool=allowed) == []
    slurm = Pool(name="s", backend="slurm", nodes=default_local_pool().nodes)
    assert spec.validate(HOSTNET, pool=slurm) == []


# ---------------------------------------------------------------- podman


def plan(tmp_path: Path, **fields: object) -> ContainerPlan:
    body: dict = {
        "image": "localhost/bb:1",
        "name": "trainyard-x",
        "hostname": "t",
        "network": "ns:/proc/7/fd/9",
        "root_dir": tmp_path / "root",
        "hosts_file": tmp_path / "hosts",
        "files": ("/app/conf.txt", "/tmp/run.sh"),
        "writable": (str(tmp_path / "out"),),
    }
    return ContainerPlan(**{**body, **fields})


def volumes(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]


def test_podman_never_pulls_and_joins_the_group_namespace(tmp_path: Path) -> None:
    argv = podman_argv(plan(tmp_path))
    assert argv[-1] == "localhost/bb:1"
    run = argv.index("run")
    assert {"--rm", "--pull"} <= set(argv[run:]) and argv[argv.index("--pull") + 1] == "never"
    assert argv[argv.index("--network") + 1] == "ns:/proc/7/fd/9"
    assert argv[argv.index("--name") + 1] == "trainyard-x"
    assert volumes(argv) == [  # /tmp/run.sh is under the bound /tmp: not bound again
        f"{tmp_path}/root/tmp:/tmp:rw",
        f"{tmp_path}/root/osmo/run/workspace:/osmo/run/workspace:rw",
        f"{tmp_path}/root/app/conf.txt:/app/conf.txt:rw",
        f"{tmp_path}/out:{tmp_path}/out:rw",
        f"{tmp_path}/hosts:/etc/hosts:ro",
    ]
    assert container_mounts(plan(tmp_path)) == {
        "/": f"{tmp_path}/root",
        f"{tmp_path}/out": f"{tmp_path}/out",
    }
    assert (
        container_name(tmp_path) == container_name(tmp_path / ".") != container_name(tmp_path / "x")
    )


def test_image_note_says_plainly_what_runs_instead() -> None:
    assert image_note(None, "host") == ""
    assert image_note("ubuntu:22.04", "podman") == ""
    assert "is NOT run: this pool runs no images" in image_note("ubuntu:22.04", "host")
    assert "podman is not installed" in image_note(
        "ubuntu:22.04", "podman", "podman is not installed"
    )


# ---------------------------------------------------------------- runner hooks


def test_the_runner_hands_the_environment_to_podman_in_a_file_only(tmp_path: Path) -> None:
    run = TaskRun.model_validate(
        {
            "workflow_id": "wf",
            "group": "g",
            "task": "t",
            "command": ["sh", "-c", "true"],
            "run_dir": str(tmp_path / "run"),
            "environment": {"SECRET": "s3cr3t", "LD_PRELOAD": "/tmp/evil.so", "PATH": "/evil"},
            "sandbox": {
                "command_prefix": ["podman", "run", "IMG"],
                "env_flag": "--env-file",
                "env_defaults": {"PATH": "/image/bin", "LANG": "C", "SECRET": "image's"},
                "mounts": {"/": str(tmp_path / "root")},
                "env": {"TOKEN": "t0k"},
            },
        }
    )
    runner = Runner(run, base_env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
    env, visible = runner.command.environment()
    start = runner.command.host_start(runner.command.argv(visible), env, visible)
    env_file = tmp_path / "run" / "task.env"
    assert start.argv[0].startswith("/") and start.argv[0].endswith("/podman")
    assert start.argv[1:] == ["run", "--env-file", str(env_file), "IMG", "sh", "-c", "true"]
    assert start.env == {"PATH": "/usr/bin:/bin", "HOME": "/root"}  # podman's: none of the spec's
    lines = env_file.read_text().splitlines()
    assert "SECRET=s3cr3t" in lines and "TOKEN=t0k" in lines and "LANG=C" in lines
    assert "LD_PRELOAD=/tmp/evil.so" in lines  # for the container, not for podman
    assert "PATH=/image/bin" in lines and not any(l.startswith("PATH=/evil") for l in lines)
    assert env_file.stat().st_mode & 0o077 == 0
    assert runner.command.unstartable(["no-such-program"], env) is None  # the runtime looks it up


def test_a_start_error_runs_nothing_and_reports_3003(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    run = TaskRun.model_validate(
        {
            "workflow_id": "wf",
            "group": "g",
            "task": "t",
            "command": ["touch", str(marker)],
            "run_dir": str(tmp_path / "run"),
            "barrier": {"enabled": True, "folder": str(tmp_path / "b"), "tasks": ["t", "u"]},
            "sandbox": {"root": str(tmp_path / "root"), "start_error": "image 'x' is not present"},
        }
    )
    assert Runner(run).execute() == ExitCode.START_ERROR
    assert not marker.exists()
    events, _ = read_events(tmp_path / "run" / "events.jsonl")
    assert [e.kind for e in events] == ["INITIALIZING", "EXITED"]
    assert "image 'x' is not present" in (tmp_path / "run" / "task.log").read_text()


# ---------------------------------------------------------------- launch requests


def launch(tmp_path: Path, **run: object) -> TaskLaunch:
    run_dir = tmp_path / "runs" / "wf" / "t" / "0"
    body = {
        "workflow_id": "wf",
        "group": "g",
        "task": "t",
        "command": ["sh", "-c", "true"],
        "run_dir": str(run_dir),
        "hosts": {"t": "127.1.2.3"},
        **run,
    }
    return TaskLaunch(TaskKey("wf", "t", 0), "g", "local-0", run_dir, body)


NET = GroupNetwork(keeper_pid=7, ns_pid=7, ns_created=0.0, user_ns=False, ns_path="/proc/7/fd/9")


def test_a_host_network_task_joins_no_namespace(tmp_path: Path) -> None:
    pool = default_local_pool().model_copy(update={"allow_host_network": True})
    backend = LocalBackend(pool, home=tmp_path / "home")
    iso = Isolation(bwrap=True, netns=True)
    req = backend.build_task_request(launch(tmp_path, host_network=True), iso, NET)
    assert req.run.sandbox.command_prefix[0] == "bwrap" and not req.joins_group_network
    assert "the host's network (hostNetwork: true)" in req.run.sandbox.description
    assert not backend._needs_group_network([launch(tmp_path, host_network=True)], iso)


@pytest.mark.skipif(probe_podman() is not None, reason=f"{probe_podman()}")
def test_an_image_of_a_podman_pool_is_a_container_request(tmp_path: Path) -> None:
    pool = default_local_pool().model_copy(update={"images": {"*": "podman"}})
    backend = LocalBackend(pool, home=tmp_path / "home")
    iso = Isolation(bwrap=True, netns=True)
    task = launch(tmp_path, image="localhost/trainyard-surely-absent:0")
    assert backend._needs_group_network([task], iso)  # podman joins it by path
    req = backend.build_task_request(task, iso, NET)
    sandbox = req.run.sandbox
    assert "podman" in sandbox.command_prefix and not req.hosted
    assert sandbox.command_prefix[-1] == "localhost/trainyard-surely-absent:0"
    assert "--network" in sandbox.command_prefix and "ns:/proc/7/fd/9" in sandbox.command_prefix
    assert sandbox.env_flag == "--env-file" and "is not present" in (sandbox.start_error or "")
    assert "podman container of image" in sandbox.description
    json.dumps(req.run.model_dump(mode="json"))  # what run.json gets


def test_a_pool_without_podman_says_the_hosts_tools_run(tmp_path: Path) -> None:
    backend = LocalBackend(default_local_pool(), home=tmp_path / "home")
    req = backend.build_task_request(
        launch(tmp_path, image="ubuntu:22.04"), Isolation(bwrap=True, netns=True), NET
    )
    assert req.run.sandbox.command_prefix[0] == "nsenter"
    assert "image ubuntu:22.04 is NOT run" in req.run.sandbox.description
    assert local_mod.loopback_address("wf", "t") in req.run.sandbox.description


def test_the_log_header_is_one_short_line_of_node_isolation_and_image(tmp_path: Path) -> None:
    """Issue 28: the header says node, isolation and what runs in a few words; the long
    description (and its capital NOT) is the detail that ``logs --verbose`` shows."""
    backend = LocalBackend(default_local_pool(), home=tmp_path / "home")
    req = backend.build_task_request(
        launch(tmp_path, image="ubuntu:22.04"), Isolation(bwrap=True, netns=True), NET
    )
    summary = req.run.sandbox.summary
    node = launch(tmp_path).node
    assert summary == (
        f"{node}, bubblewrap sandbox, host tools (image ubuntu:22.04 not run: "
        "no image runtime on this pool)"
    ), summary
    plain = backend.build_task_request(launch(tmp_path), Isolation(bwrap=False, netns=False), None)
    assert plain.run.sandbox.summary == f"{node}, no sandbox, host tools"


def test_where_pasta_cannot_attach_the_log_says_no_egress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_request, "why_no_egress", lambda: "pasta is not installed")
    backend = LocalBackend(default_local_pool(), home=tmp_path / "home")
    req = backend.build_task_request(launch(tmp_path), Isolation(bwrap=True, netns=True), NET)
    assert "no egress (pasta is not installed)" in req.run.sandbox.description
    assert not backend._egress_on()
    off = LocalBackend(
        default_local_pool().model_copy(update={"egress": False}), home=tmp_path / "home"
    )
    assert (
        "no egress (pool egress: false)"
        in off.build_task_request(
            launch(tmp_path), Isolation(bwrap=True, netns=True), NET
        ).run.sandbox.description
    )


def test_the_log_says_whether_egress_goes_through_the_router(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_request, "why_no_egress", lambda: None)
    backend = LocalBackend(default_local_pool(), home=tmp_path / "home")
    monkeypatch.setattr(local_request, "probe_router", lambda: None)
    text = backend.build_task_request(
        launch(tmp_path), Isolation(bwrap=True, netns=True), NET
    ).run.sandbox.description
    assert "egress through pasta behind the launcher's egress router" in text
    monkeypatch.setattr(
        local_request, "probe_router", lambda: "nft is not installed (Debian package nftables)"
    )
    text = backend.build_task_request(
        launch(tmp_path), Isolation(bwrap=True, netns=True), NET
    ).run.sandbox.description
    assert (
        "egress through pasta of its own (no egress router: nft is not installed "
        "(Debian package nftables))"
    ) in text


def test_pasta_names_its_interface_for_the_router() -> None:
    argv = pasta_argv("/proc/self/fd/5", as_root=True, ifname="tyup")
    assert argv[argv.index("-I") + 1] == "tyup"
    assert "-I" not in pasta_argv("/proc/self/fd/5", as_root=True)


def test_the_hosts_file_names_each_ipv4_address_also_in_its_mapped_form() -> None:
    """A dual-stack server sees an IPv4 peer as ::ffff:a.b.c.d; glibc's files source names it
    only from a line in that form (else it asks DNS: issue 15's stalls)."""
    lines = hosts_file_text(
        {"master": "10.0.0.2", "worker": "10.0.0.3", "v6": "fd00::5"}
    ).splitlines()
    for address, name in [
        ("10.0.0.2", "master"),
        ("10.0.0.3", "worker"),
        ("127.0.0.1", "localhost"),
    ]:
        assert f"{address}\t{name}" in lines and f"::ffff:{address}\t{name}" in lines
    assert "fd00::5\tv6" in lines and not any(line.startswith("::ffff:fd00") for line in lines)
