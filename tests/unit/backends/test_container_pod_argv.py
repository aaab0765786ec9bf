"""Issue 11, images: what an image task's ``podman run`` and runner input ask for so that it
gets what a pod (and a bubblewrap task) gets: its pool-allowed ``volumeMounts``, its GPUs, a
writable root that RESTART keeps. Fast checks without processes;
tests/integration/backends/test_container_pod_parity.py runs the real thing."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.backends.base import TaskKey, TaskLaunch
from trainyard.backends.local import Isolation, LocalBackend, container, container_image
from trainyard.backends.local.container import (
    ContainerPlan,
    cdi_gpu_names,
    container_mounts,
    container_userns,
    gpu_devices,
    podman_argv,
    rootfs_path,
)
from trainyard.backends.local.container_image import (
    image_info,
    image_links,
    root_overlay,
    task_id_bases,
    user_host_ids,
    user_ids,
    user_note,
    why_no_own_root,
)
from trainyard.backends.local.netns import GroupNetwork
from trainyard.errors import BackendError
from trainyard.pools import Pool, default_local_pool

NET = GroupNetwork(keeper_pid=7, ns_pid=7, ns_created=0.0, user_ns=False, ns_path="/proc/7/fd/9")
ISO = Isolation(bwrap=True, netns=True)


def plan(tmp_path: Path, **fields: object) -> ContainerPlan:
    return ContainerPlan(
        image="localhost/bb:1",
        name="trainyard-x",
        hostname="t",
        network="ns:/proc/7/fd/9",
        root_dir=tmp_path / "root",
        **fields,
    )


def _after(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def launch(tmp_path: Path, **run: object) -> TaskLaunch:
    run_dir = tmp_path / "runs" / "wf" / "t" / "0"
    body = {
        "workflow_id": "wf",
        "group": "g",
        "task": "t",
        "command": ["sh", "-c", "true"],
        "run_dir": str(run_dir),
        "hosts": {"t": "127.1.2.3"},
        "image": "localhost/trainyard-surely-absent:0",
        **run,
    }
    return TaskLaunch(TaskKey("wf", "t", 0), "g", "local-0", run_dir, body)


def podman_backend(tmp_path: Path, allowed: list[str]) -> LocalBackend:
    base = default_local_pool()
    pool = Pool(
        name=base.name,
        nodes=base.nodes,
        images={"*": "podman"},
        options={**base.options, "allowed_mounts": allowed},
    )
    return LocalBackend(pool, home=tmp_path / "home")


@pytest.fixture(autouse=True)
def _podman_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests only: no podman needed to build them."""
    monkeypatch.setattr(LocalBackend, "_why_no_podman", lambda self: None)


# ---------------------------------------------------------------- volumeMounts


def test_volumes_are_bound_at_their_place_and_mapped_by_the_runner(tmp_path: Path) -> None:
    shared = tmp_path / "shared data"
    made = plan(
        tmp_path,
        volumes=((str(shared / "a"), "/mnt/a"), (str(shared), "/mnt")),
        files=("/mnt/a/conf.txt", "/app/x"),
    )
    volumes = _after(podman_argv(made), "--volume")
    assert volumes[-2:] == [f"{shared}:/mnt:rw", f"{shared}/a:/mnt/a:rw"]  # parents first
    assert not any(v.startswith(f"{tmp_path}/root/mnt") for v in volumes)  # a file under a
    # volume is written into the volume's host folder, not bound from the root folder
    assert container_mounts(made)["/mnt/a"] == f"{shared}/a"


def test_an_image_task_gets_its_allowed_volumes_checked_and_mapped(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    backend = podman_backend(tmp_path, [str(shared)])
    req = backend.build_task_request(
        launch(tmp_path, volume_mounts=[f"{shared}/team:/mnt/team"]), ISO, NET
    )
    sandbox = req.run.sandbox
    assert f"{shared}/team:/mnt/team:rw" in _after(sandbox.command_prefix, "--volume")
    # the runner checks it exists (3003 otherwise) and idmaps it for the container's root
    assert sandbox.volumes == {"/mnt/team": f"{shared}/team"}
    assert sandbox.userns is not None and sandbox.userns.host_uid == 65534


@pytest.mark.parametrize("mount", ["/etc:/mnt/etc", "/tmp/elsewhere:/mnt/x"])
def test_the_pool_rules_apply_to_image_tasks_as_to_sandboxed_ones(
    tmp_path: Path, mount: str
) -> None:
    backend = podman_backend(tmp_path, [str(tmp_path / "shared")])
    with pytest.raises(BackendError, match="is not in the pool's options.allowed_mounts"):
        backend.build_task_request(launch(tmp_path, volume_mounts=[mount]), ISO, NET)


def test_a_volume_onto_a_system_folder_is_refused_for_image_tasks(tmp_path: Path) -> None:
    backend = podman_backend(tmp_path, [str(tmp_path)])
    with pytest.raises(BackendError, match="cannot mount onto /proc"):
        backend.build_task_request(
            launch(tmp_path, volume_mounts=[f"{tmp_path}:/proc/x"]), ISO, NET
        )


# ---------------------------------------------------------------- GPUs

NODES = (
    "/dev/dri",
    "/dev/nvidia-caps",
    "/dev/nvidia-uvm",
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidiactl",
)
CDI_SPEC = """cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: "1"
  containerEdits: {deviceNodes: [{path: /dev/nvidia1}]}
- name: all
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}, {path: /dev/nvidia1}]}
containerEdits:
  deviceNodes: [{path: /dev/nvidiactl}]
"""


def test_without_a_cdi_spec_every_gpu_node_is_passed_and_the_lent_ones_are_visible() -> None:
    """As the bubblewrap sandbox: the host's nodes, CUDA_VISIBLE_DEVICES by host index."""
    devices, visible = gpu_devices((1,), nodes=NODES, cdi_names=())
    assert devices == NODES and visible == "1"
    argv = podman_argv(plan(Path("/x"), devices=devices))
    assert _after(argv, "--device") == list(NODES)
    assert argv[-1] == "localhost/bb:1"  # the runner's --env NAME pairs still go before it


def test_with_a_cdi_spec_each_lent_gpu_is_a_cdi_device_counted_from_0(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text(CDI_SPEC)
    (cdi / "broken.yaml").write_text("kind: [unclosed")
    (cdi / "other.json").write_text('{"kind": "vendor.com/fpga", "devices": [{"name": "7"}]}')
    names = cdi_gpu_names((cdi, tmp_path / "absent"))
    assert names == {"0", "1", "all"}
    assert gpu_devices((1, 0), nodes=NODES, cdi_names=names) == (
        ("nvidia.com/gpu=0", "nvidia.com/gpu=1"),
        "0,1",
    )
    # a lent GPU the spec does not name: the nodes, as without a spec
    assert gpu_devices((2,), nodes=NODES, cdi_names=names) == (NODES, "2")


def test_a_task_lent_no_gpu_gets_no_gpu_device() -> None:
    assert gpu_devices((), nodes=NODES, cdi_names={"0"}) == ((), "")


def test_an_image_task_gets_its_lent_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(container, "gpu_device_nodes", lambda: NODES)
    monkeypatch.setattr(container, "cdi_gpu_names", lambda: frozenset())
    backend = podman_backend(tmp_path, [])
    req = backend.build_task_request(launch(tmp_path), ISO, NET, gpus=(0, 1))
    assert _after(req.run.sandbox.command_prefix, "--device") == list(NODES)
    assert req.run.sandbox.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    none = backend.build_task_request(launch(tmp_path), ISO, NET)
    assert "--device" not in none.run.sandbox.command_prefix
    assert none.run.sandbox.env["CUDA_VISIBLE_DEVICES"] == ""


# ---------------------------------------------------------------- the container's own root

INSPECTED = {
    "Id": "abc",
    "Config": {"Env": ["PATH=/opt/bin:/bin", "LANG=C"]},
    "GraphDriver": {
        "Name": "overlay",
        "Data": {
            "UpperDir": "/s/overlay/top/diff",
            "LowerDir": "/s/overlay/mid/diff:/s/overlay/base/diff",
            "WorkDir": "/s/overlay/top/work",
        },
    },
}


def test_the_image_layers_and_env_are_read_from_podman_inspect() -> None:
    info = image_info(INSPECTED)
    assert info.layers == ("/s/overlay/top/diff", "/s/overlay/mid/diff", "/s/overlay/base/diff")
    assert info.env == ("PATH=/opt/bin:/bin", "LANG=C") and info.id == "abc"
    single = image_info({"Id": "x", "GraphDriver": {"Name": "overlay", "Data": {"UpperDir": "/u"}}})
    assert single.layers == ("/u",) and single.env == ()
    vfs = image_info({"Id": "x", "GraphDriver": {"Name": "vfs", "Data": {"UpperDir": "/u"}}})
    assert vfs.layers == ()
    assert why_no_own_root(vfs, overlay_ok=True) is not None
    assert why_no_own_root(image_info(INSPECTED), overlay_ok=False) is not None
    assert why_no_own_root(image_info(INSPECTED), overlay_ok=True) is None


def test_a_container_with_its_own_root_runs_it_with_the_images_env(tmp_path: Path) -> None:
    info = image_info(INSPECTED)
    made = plan(
        tmp_path,
        rootfs=rootfs_path("trainyard-x"),
        image_env=info.env,
        files=("/app/conf.txt", "/tmp/run.sh"),
        writable=(str(tmp_path / "out"),),
    )
    argv = podman_argv(made)
    assert argv[-2:] == ["--rootfs", "/run/trainyard/rootfs/trainyard-x"]
    assert "localhost/bb:1" not in argv  # the image's layers are mounted by the runner
    assert _after(argv, "--env") == []  # the image's ENV goes in the runner's env file
    assert _after(argv, "--volume") == [  # /tmp and the files live in its root
        f"{tmp_path}/root/osmo/run/workspace:/osmo/run/workspace:rw",
        f"{tmp_path}/out:{tmp_path}/out:rw",
    ]
    assert container_mounts(made) == {
        "/": "/run/trainyard/rootfs/trainyard-x",
        "/osmo/run/workspace": f"{tmp_path}/root/osmo/run/workspace",
        f"{tmp_path}/out": f"{tmp_path}/out",
    }
    assert container_userns(made).own[1:] == [
        f"{tmp_path}/root/osmo/run/workspace",
        "/run/trainyard/rootfs/trainyard-x",
        "/run/trainyard/rootfs/trainyard-x/tmp",
        "/run/trainyard/rootfs/trainyard-x/etc",
    ]
    layer = root_overlay(made, info, tmp_path / "run" / "sandbox" / "overlay" / "image")
    assert (layer.lower, layer.lower_below) == (info.layers[0], list(info.layers[1:]))
    assert layer.target == "/run/trainyard/rootfs/trainyard-x"
    assert layer.upper == f"{tmp_path}/run/sandbox/overlay/image/upper"  # moved by RESTART
    assert (layer.idmap_uid, layer.idmap_gid, layer.nodev) == (65534, 65534, True)


def test_where_no_own_root_can_be_made_the_log_says_restart_does_not_keep_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        container_image,
        "inspect_image",
        lambda image: image_info({**INSPECTED, "GraphDriver": {"Name": "vfs"}}),
    )
    req = podman_backend(tmp_path, []).build_task_request(launch(tmp_path), ISO, NET)
    assert req.run.sandbox.command_prefix[-1] == "localhost/trainyard-surely-absent:0"
    assert req.run.sandbox.overlays == [] and req.run.sandbox.start_error is None
    assert "podman's container layer, which RESTART does NOT keep" in req.run.sandbox.description


@pytest.mark.parametrize(
    ("user", "root"),
    [
        ("", True),
        ("root", True),
        ("0:0", True),
        ("root:0", True),
        ("1000", False),
        ("0:1000", False),
        ("app", False),
    ],
)
def test_only_a_root_user_is_mapped(user: str, root: bool) -> None:
    info = image_info({**INSPECTED, "Config": {"User": user}})
    assert info.user == user and info.runs_as_root is root
    note, error = user_note("img", info, own_root=True)
    assert error is None and (note == "") is root
    note, error = user_note("img", info, own_root=False)
    assert note == "" and (error is None) is root


def test_a_link_of_the_image_at_tmp_or_etc_is_not_given_to_the_task(tmp_path: Path) -> None:
    top, base = tmp_path / "top", tmp_path / "base"
    (top / "etc").mkdir(parents=True)
    base.mkdir()
    (base / "tmp").symlink_to("var/tmp")
    (base / "etc").symlink_to("somewhere")  # hidden by the top layer's folder
    info = image_info(
        {
            "Id": "x",
            "GraphDriver": {
                "Name": "overlay",
                "Data": {"UpperDir": str(top), "LowerDir": str(base)},
            },
        }
    )
    assert image_links(info) == {"tmp"}
    made = plan(tmp_path, rootfs=rootfs_path("trainyard-x"))
    assert container_userns(made, image_links(info)).own[2:] == [
        "/run/trainyard/rootfs/trainyard-x",
        "/run/trainyard/rootfs/trainyard-x/etc",
    ]


# ---------------------------------------------------------------- more ids (issue 11 item 4)


def test_a_trainyard_range_of_subuid_and_subgid_maps_the_containers_other_ids(
    tmp_path: Path,
) -> None:
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("alice:100000:65536\ntrainyard:1000:65536\ntrainyard:300000:65536\n")
    subgid.write_text("trainyard:400000:70000\n")
    assert task_id_bases(subuid, subgid) == (300000, 400000)  # 1000..: would hold nobody
    assert task_id_bases(subuid, tmp_path / "absent") is None
    subgid.write_text("trainyard:400000:100\n")  # too few ids
    assert task_id_bases(subuid, subgid) is None
    made = plan(tmp_path, rootfs=rootfs_path("trainyard-x"), id_bases=(300000, 400000), user="app")
    argv = podman_argv(made)
    assert _after(argv, "--uidmap") == ["0:65534:1", "1:300000:65535"]
    assert _after(argv, "--gidmap") == ["0:65534:1", "1:400000:65535"]
    assert _after(argv, "--user") == ["app"]
    layer = root_overlay(made, image_info(INSPECTED), tmp_path / "image")
    assert (layer.idmap_uid_base, layer.idmap_gid_base) == (300000, 400000)


def test_the_image_user_is_read_from_its_passwd_and_group(tmp_path: Path) -> None:
    top, base = tmp_path / "top", tmp_path / "base"
    (top / "etc").mkdir(parents=True)
    (base / "etc").mkdir(parents=True)
    (top / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\napp:x:1001:1002::/h:/bin/sh\n")
    (base / "etc" / "passwd").write_text("app:x:5:5::/h:/bin/sh\n")  # hidden by the top layer
    (base / "etc" / "group").write_text("staff:x:50:\n")
    layers = {
        "GraphDriver": {"Name": "overlay", "Data": {"UpperDir": str(top), "LowerDir": str(base)}}
    }

    def ids(user: str) -> tuple[int, int] | None:
        return user_ids(image_info({"Id": "x", "Config": {"User": user}, **layers}))

    assert ids("app") == (1001, 1002) and ids("app:staff") == (1001, 50)
    assert ids("1000") == (1000, 0) and ids("1000:7") == (1000, 7)
    assert ids("nobody-here") is None and ids("70000") is None  # not found, not mapped
    assert user_host_ids((1001, 0), (300000, 400000)) == (301000, 65534)


def test_the_layers_map_is_root_to_nobody_and_the_others_to_the_range() -> None:
    from trainyard.linux.safefs import _id_map

    assert _id_map(65534, True, 300000) == "0 65534 1\n1 300000 65535\n"
    assert _id_map(65534, True).startswith("0 65534 1\n65534 0 1\n")  # unchanged without
