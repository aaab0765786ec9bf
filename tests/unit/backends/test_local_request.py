"""Building a local launch (no processes): argv, sandbox plan, environment, registry."""

from __future__ import annotations

import ipaddress
import os
import shutil
from pathlib import Path

import pytest

from trainyard.backends import get_backend
from trainyard.backends.base import TaskKey, TaskLaunch
from trainyard.backends.local import Isolation, LocalBackend, loopback_address, tracking
from trainyard.backends.local import backend as local_mod
from trainyard.backends.local import probe as local_probe
from trainyard.backends.local import request as local_request
from trainyard.backends.local.netns import GroupNetwork
from trainyard.backends.local.sandbox import SandboxPlan, bwrap_argv, needs_bind
from trainyard.errors import BackendError, ConfigError
from trainyard.pools import Pool, default_local_pool


def launch(tmp_path: Path, **run: object) -> TaskLaunch:
    run_dir = tmp_path / "runs" / "wf" / "t" / "0"
    body = {
        "workflow_id": "wf",
        "group": "g",
        "task": "t",
        "command": ["sh", "-c", "true"],
        "run_dir": str(run_dir),
        "hosts": {"t": "127.1.2.3", "u": "127.1.2.4"},
        **run,
    }
    return TaskLaunch(TaskKey("wf", "t", 0), "g", "local-0", run_dir, body, gpu_slots=[1, 3])


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


@pytest.mark.parametrize("as_root", [True, False])
def test_a_hosted_runner_joins_the_group_namespace_in_the_launcher_instead_of_nsenter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_root: bool
) -> None:
    monkeypatch.setattr(local_request, "holds_namespaces", lambda: as_root)
    backend = LocalBackend(home=tmp_path / "home")
    iso = Isolation(bwrap=True, netns=True)
    net = GroupNetwork(
        keeper_pid=7, ns_pid=7, ns_created=0.0, user_ns=False, ns_path="/proc/7/fd/9"
    )
    plain, with_data = launch(tmp_path), launch(tmp_path, outputs=[{"url": "file:///o/"}])
    assert local_request.joins_in_launcher(plain, iso) is as_root
    assert not local_request.joins_in_launcher(with_data, iso)
    assert not local_request.joins_in_launcher(plain, Isolation(bwrap=False, netns=True))
    if as_root:  # no namespace asked for: the launcher makes or finds it for the thread
        req = backend.build_task_request(plain, iso)
        assert req.hosted and req.joins_group_network
        assert req.run.sandbox.command_prefix[0] == "bwrap"
    else:  # a namespace held by a child process: nsenter joins it, user namespace too
        assert not backend.build_task_request(plain, iso).joins_group_network
    req = backend.build_task_request(with_data, iso, net)
    assert not req.hosted and not req.joins_group_network
    assert req.run.sandbox.command_prefix[:3] == ["nsenter", "--net=/proc/7/fd/9", "--"]


def test_sandboxed_command_joins_the_group_namespace_then_bwrap(tmp_path: Path) -> None:
    backend = LocalBackend(home=tmp_path / "home")
    net = GroupNetwork(keeper_pid=1, ns_pid=42, ns_created=0.0, user_ns=True)
    req = backend.build_task_request(launch(tmp_path), Isolation(bwrap=True, netns=True), net)
    assert req.argv == [backend.python, "-m", "trainyard.runner", str(req.run_dir / "run.json")]
    argv = req.run.sandbox.command_prefix  # the runner stays outside; the command goes in
    assert argv[:6] == ["nsenter", "--target=42", "--net", "--user", "--preserve-credentials", "--"]
    assert argv[6] == "bwrap" and argv[7:10] == ["--bind", str(req.root_dir), "/"]
    tail = argv[argv.index("--chdir") :]
    assert tail == ["--chdir", "/", "--"] and "--die-with-parent" in argv
    assert ["--hostname", "t"] == argv[argv.index("--hostname") : argv.index("--hostname") + 2]
    assert {"--unshare-pid", "--unshare-ipc", "--unshare-uts"} <= set(argv)
    assert ("/tmp", "/tmp") not in pairs(argv, "--bind") + pairs(argv, "--ro-bind")
    binds = pairs(argv, "--bind") + pairs(argv, "--ro-bind")
    output = os.path.realpath(req.run.output_path)
    assert (output, output) in pairs(argv, "--bind")  # its own output, never its run folder
    assert not [b for b in binds if b[1] in (os.path.realpath(req.run_dir), str(tmp_path))]
    assert argv[argv.index("--unshare-user") : argv.index("--unshare-user") + 8] == [
        "--unshare-user",
        "--uid",
        "0",
        "--gid",
        "0",
        "--disable-userns",
        "--cap-drop",
        "ALL",
    ]
    assert req.run.sandbox.root is None
    assert req.hosts_text is not None and "127.1.2.4\tu" in req.hosts_text
    sandbox = req.run.sandbox
    assert sandbox.host_path("/tmp/run.sh") == f"{req.root_dir}/tmp/run.sh"
    assert sandbox.host_path("/app/x") == f"{req.root_dir}/app/x"
    assert sandbox.host_path(str(req.run.output_path / "m")) == str(req.run.output_path / "m")
    if sandbox.overlays:  # as root: system folders get a private writable layer
        layer = next(o for o in sandbox.overlays if o.lower in ("/", "/usr"))
        assert sandbox.host_path("/usr/bin/env").startswith(layer.target)
        assert sandbox.host_path("/usr/bin/env").endswith("/bin/env")
        assert layer.upper.startswith(str(req.run_dir / "sandbox" / "overlay"))
        assert sandbox.writable("/usr/lib/x") and sandbox.writable("/etc/passwd")
    else:
        assert sandbox.host_path("/usr/bin/env") == "/usr/bin/env"
        assert not sandbox.writable("/usr/lib/x") and not sandbox.writable("/etc/passwd")
    assert sandbox.writable("/tmp/x") and sandbox.writable(str(req.run.output_path / "m"))


def test_fallback_request_is_the_bare_runner_with_a_private_root(tmp_path: Path) -> None:
    backend = LocalBackend(home=tmp_path / "home")
    req = backend.build_task_request(launch(tmp_path), Isolation(bwrap=False, netns=False))
    assert req.argv == [backend.python, "-m", "trainyard.runner", str(req.run_dir / "run.json")]
    assert req.run.sandbox.command_prefix == [] and req.run.sandbox.mounts == {}
    assert req.run.sandbox.root == str(req.run_dir / "sandbox" / "root")
    assert "GLOO_SOCKET_IFNAME" not in req.run.sandbox.env


def test_environment_gpus_and_interfaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LocalBackend(home=tmp_path / "home")
    monkeypatch.delenv("TRAINYARD_SERVER_URL", raising=False)
    req = backend.build_task_request(
        launch(tmp_path, environment={"NCCL_SOCKET_IFNAME": "eth9"}),
        Isolation(bwrap=False, netns=True),
        gpus=(1,),
    )
    env = req.run.sandbox.env
    assert env["CUDA_VISIBLE_DEVICES"] == "1"  # the real GPUs lent, not the slot numbers
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and "NCCL_SOCKET_IFNAME" not in env
    req = backend.build_task_request(launch(tmp_path), Isolation(bwrap=False, netns=False))
    assert req.run.sandbox.env["CUDA_VISIBLE_DEVICES"] == ""


def _attempt(task: str) -> tracking.Attempt:
    return tracking.Attempt(TaskKey("wf", task, 0), None)


def test_real_gpus_are_lent_exclusively_across_virtual_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracking, "gpu_count", lambda: 3)
    leases = local_mod.GpuLeases()
    # slot 0 of local-0 and slot 0 of local-1: two tasks, two different devices
    on_node0, on_node1, third = _attempt("a"), _attempt("b"), _attempt("c")
    assert leases.lend(on_node0, 1) == (0,)
    assert leases.lend(on_node1, 1) == (1,)
    assert leases.lend(third, 2) == (2,)  # one real GPU left: its other slot runs as CPU
    assert leases.lend(_attempt("d"), 1) == ()
    leases.give_back(on_node1)
    assert leases.lend(_attempt("e"), 8) == (1,)
    on_node0.done = True  # ended without a give_back: the lease lapses by itself
    assert leases.lent() == {1: TaskKey("wf", "e", 0), 2: TaskKey("wf", "c", 0)}


def test_no_real_gpus_lends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking, "gpu_count", lambda: 0)
    assert local_mod.GpuLeases().lend(_attempt("a"), 8) == ()


def test_unstarted_means_no_index_entry(tmp_path: Path) -> None:
    backend = LocalBackend(home=tmp_path / "home")
    known, unknown = TaskKey("wf", "t", 0), TaskKey("wf", "t", 1)
    backend.index.write(known, {"run_dir": str(tmp_path / "r")})
    assert backend.unstarted([known, unknown]) == [unknown]


def test_server_url_comes_from_server_json_and_its_port_is_forwarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRAINYARD_SERVER_URL", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    (home / "server.json").write_text(
        '{"pid": 1, "url": "http://127.0.0.1:8123", "create_time_s": 0}'
    )
    backend = LocalBackend(home=home, forward_ports=[9000])
    req = backend.build_task_request(launch(tmp_path), Isolation(bwrap=False, netns=False))
    assert req.run.sandbox.env["TRAINYARD_SERVER_URL"] == "http://127.0.0.1:8123"
    assert backend._forwarded_ports() == [8123, 9000]


def test_busybox_image_puts_applets_first(tmp_path: Path) -> None:
    if not shutil.which("busybox"):
        pytest.skip("busybox not installed")
    backend = LocalBackend(home=tmp_path / "home")
    req = backend.build_task_request(launch(tmp_path, image="alpine:3.18"), Isolation(False, False))
    (folder,) = req.run.sandbox.path_prepend
    assert os.path.realpath(Path(folder) / "nc") == os.path.realpath(shutil.which("busybox"))
    ubuntu = backend.build_task_request(
        launch(tmp_path, image="ubuntu:22.04"), Isolation(False, False)
    )
    assert ubuntu.run.sandbox.path_prepend == []


def test_loopback_addresses_are_stable_distinct_and_not_127_0_0() -> None:
    addresses = {loopback_address(w, t) for w in ("wf-a", "wf-b") for t in ("master", "worker_1")}
    assert len(addresses) == 4
    assert loopback_address("wf-a", "master") == loopback_address("wf-a", "master")
    for address in addresses:
        ip = ipaddress.ip_address(address)
        assert ip.is_loopback and not address.startswith("127.0.0.")
        assert address.split(".")[3] not in ("0", "255")


def test_needs_bind_for_hidden_or_read_only_paths() -> None:
    assert needs_bind("/tmp/x/run", writable=True)
    assert needs_bind("/usr/lib/python3", writable=True)
    assert not needs_bind("/usr/lib/python3", writable=False)
    assert not needs_bind("/", writable=False)


def test_bwrap_binds_parents_first_and_never_tmp_itself(tmp_path: Path) -> None:
    plan = SandboxPlan(
        root_dir=tmp_path / "root",
        hostname="h",
        writable=("/tmp/a/b", "/tmp"),
        readonly=("/tmp/a",),
    )
    argv = bwrap_argv(plan)
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    extra = [b for b in binds[1:] if b.startswith("/tmp")]  # binds[0]: the root
    assert extra == [os.path.realpath("/tmp/a"), os.path.realpath("/tmp/a/b")]


def test_bwrap_keeps_symlinks_already_in_the_root(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "bin").symlink_to("usr/bin")
    root = tmp_path / "root"
    root.mkdir()
    fresh = bwrap_argv(SandboxPlan(root_dir=root, hostname="h", host_root=host))
    assert ("usr/bin", "/bin") in pairs(fresh, "--symlink")
    (root / "bin").symlink_to("usr/bin")
    again = bwrap_argv(SandboxPlan(root_dir=root, hostname="h", host_root=host))
    assert pairs(again, "--symlink") == []


def test_options_are_checked_with_the_choices_listed(tmp_path: Path) -> None:
    pool = Pool(name="p", nodes=default_local_pool().nodes, options={"sandbox": "docker"})
    with pytest.raises(ConfigError, match="auto, bwrap, none"):
        LocalBackend(pool, tmp_path)


def test_registry(tmp_path: Path) -> None:
    assert isinstance(get_backend(default_local_pool(), tmp_path), LocalBackend)
    pool = Pool(name="p", backend="mainframe", nodes=default_local_pool().nodes)
    with pytest.raises(ConfigError, match="kubernetes, local, slurm"):
        get_backend(pool, tmp_path)


def test_probe_falls_back_with_one_warning_and_refuses_explicit_modes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(local_probe, "probe_netns", lambda python: "user namespaces disabled")
    monkeypatch.setattr(local_probe, "probe_bwrap", lambda prefix=None: "bwrap: permission denied")
    monkeypatch.setattr(local_probe, "_probed", {})
    monkeypatch.setattr(local_probe, "_warned", set())
    with caplog.at_level("WARNING", logger="trainyard.backends.local"):
        assert local_probe.probe_isolation("auto", "auto", "py") == Isolation(False, False)
        local_probe.probe_isolation("auto", "auto", "py")
        local_probe._probe("auto", "auto", "py")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert any("permission denied" in w for w in warnings)
    assert any("user namespaces disabled" in w for w in warnings)
    with pytest.raises(BackendError, match="permission denied"):
        local_probe.probe_isolation("bwrap", "loopback", "py")
