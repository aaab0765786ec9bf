"""``/osmo/run/workspace`` in every task's sandbox (OSMO: "/osmo/run/workspace is always
available as a remote path", user guide, Interactive > Rsync): an empty folder of the task's
own, made by bwrap, given to the task's uid by the runner, and cleared of links the task
left before each start. The real sandbox's view is tested in
tests/integration/cli/test_rsync_osmo_forms.py."""

from __future__ import annotations

import os
from pathlib import Path

from trainyard.backends.local.container import ContainerPlan, podman_argv
from trainyard.backends.local.sandbox import (
    OSMO_WORKSPACE,
    SandboxPlan,
    bwrap_argv,
    clear_links,
    task_owned,
)


def test_bwrap_makes_the_workspace_and_the_runner_gives_it_to_the_task(tmp_path: Path) -> None:
    root = tmp_path / "root"
    plan = SandboxPlan(root_dir=root, hostname="t", host_uid=65534)
    argv = bwrap_argv(plan)
    pairs = list(zip(argv, argv[1:], strict=False))
    assert OSMO_WORKSPACE == "/osmo/run/workspace"
    assert ("--dir", "/osmo") in pairs and ("--dir", OSMO_WORKSPACE) in pairs
    own, _below = task_owned(plan)
    made = [p for p in own if p.startswith(str(root / "osmo"))]
    # in this order: the runner makes each with one mkdir, parents first
    assert made == [str(root / "osmo"), str(root / "osmo/run"), str(root / "osmo/run/workspace")]


def test_a_link_the_task_left_on_the_way_is_removed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    (root / "osmo").mkdir(parents=True)
    os.symlink(outside, root / "osmo" / "run")
    (tmp_path / "host" / "usr").mkdir(parents=True)
    removed = clear_links(SandboxPlan(root_dir=root, hostname="t", host_root=tmp_path / "host"))
    assert "/osmo/run" in removed or OSMO_WORKSPACE in removed
    assert not (root / "osmo" / "run").is_symlink() and list(outside.iterdir()) == []


def test_a_podman_task_gets_the_workspace_from_its_own_folder(tmp_path: Path) -> None:
    plan = ContainerPlan(image="img", name="c", hostname="t", network="host", root_dir=tmp_path)
    argv = podman_argv(plan)
    assert f"{tmp_path}/osmo/run/workspace:{OSMO_WORKSPACE}:rw" in argv
