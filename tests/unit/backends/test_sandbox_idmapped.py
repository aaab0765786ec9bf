"""The idmapped system folders of a remapped task's sandbox (issue 11: a task could not edit
root's files of its private ``/usr`` in place): which folders get an idmapped lower layer,
where it is mounted, what is covered, and what is never idmapped. Without processes; the
real sandbox: tests/integration/engine/test_sandbox_system_edits.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainyard.backends.local import hostscan, sandbox
from trainyard.backends.local.sandbox import (
    IDMAPPED,
    SandboxPlan,
    bwrap_argv,
    clear_links,
    idmapped_covers,
    overlays,
)
from trainyard.linux.safefs import _id_map


@pytest.fixture(autouse=True)
def _fresh_scan() -> None:
    hostscan._scan_root_only.cache_clear()


def host(tmp_path: Path) -> Path:
    """A fake host ``/`` (its files are the test's user's: root in CI and here)."""
    root = tmp_path / "host"
    for folder in ("usr/share/doc", "usr/local/etc", "etc/ssl", "var/lib/dpkg", "var/cache"):
        (root / folder).mkdir(parents=True)
    (root / "usr/share/doc/readme").write_text("open\n")
    for secret in ("usr/local/etc/token", "etc/ssl/key", "var/cache/passwords.dat"):
        (root / secret).write_text("secret\n")
        (root / secret).chmod(0o600)
    (root / "var/lib/dpkg/lock").write_text("")
    (root / "var/lib/dpkg/lock").chmod(0o640)
    (root / "usr/share/private").mkdir(mode=0o700)
    (root / "usr/share/listed").mkdir()
    (root / "usr/share/listed").chmod(0o744)  # others may list it but not pass it
    (root / "usr/share/listed/inner").write_text("unreachable for others\n")
    return root


def plan(tmp_path: Path, **fields: object) -> SandboxPlan:
    run = tmp_path / "run" / "sandbox"
    return SandboxPlan(
        root_dir=run / "root",
        hostname="t",
        host_root=host(tmp_path),
        overlay_dir=run / "overlay",
        idmapped=IDMAPPED,
        **fields,
    )  # type: ignore[arg-type]


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake host's files must be root's")
def test_usr_and_dpkg_state_get_an_idmapped_layer_over_the_root_layer(tmp_path: Path) -> None:
    made = plan(tmp_path, host_uid=65534)
    root_layer, *idmapped = overlays(made)
    assert root_layer.idmap_uid is None and root_layer.lower == str(made.host_root)
    mnt = made.overlay_dir / "rootfs" / "mnt"  # type: ignore[operator]
    assert [(o.lower, o.target, o.idmap_uid, o.idmap_gid) for o in idmapped] == [
        (f"{made.host_root}/usr", str(mnt / "usr"), 65534, 65534),
        (f"{made.host_root}/var/lib/dpkg", str(mnt / "var/lib/dpkg"), 65534, 65534),
    ]
    assert all(Path(o.upper).parent.parent == made.overlay_dir / "idmapped" for o in idmapped)
    assert idmapped_covers(made) == (
        ("/usr/local/etc/token", False),
        ("/usr/share/listed", True),
        ("/usr/share/private", True),
    )
    argv = bwrap_argv(made)
    assert ("--ro-bind", "/dev/null", "/usr/local/etc/token") in zip(
        argv, argv[1:], argv[2:], strict=False
    )
    assert ("--tmpfs", "/usr/share/private") in zip(argv, argv[1:], strict=False)
    assert "/etc/ssl/key" not in argv  # /etc is not idmapped: the remap alone keeps it


def test_nothing_is_idmapped_without_the_uid_remap_or_the_layers(tmp_path: Path) -> None:
    assert [o.idmap_uid for o in overlays(plan(tmp_path))] == [None]
    no_layers = SandboxPlan(
        root_dir=tmp_path / "r",
        hostname="t",
        host_root=tmp_path / "run",
        host_uid=65534,
        idmapped=IDMAPPED,
    )
    assert overlays(no_layers) == [] and idmapped_covers(no_layers) == ()
    assert not {"etc", "var", "var/cache", "var/lib"} & set(IDMAPPED)


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake host's files must be root's")
def test_a_link_the_task_left_at_a_cover_is_removed_from_its_idmapped_layer(
    tmp_path: Path,
) -> None:
    made = plan(tmp_path, host_uid=65534)
    upper = Path(overlays(made)[1].upper)
    (upper / "local" / "etc").mkdir(parents=True)
    (upper / "local" / "etc" / "token").symlink_to("/etc/shadow")
    assert "/usr/local/etc/token" in clear_links(made)
    assert not (upper / "local" / "etc" / "token").is_symlink()


def test_the_layer_map_swaps_root_and_nobody_and_keeps_every_other_id() -> None:
    assert _id_map(65534, keep_others=False) == "0 65534 1\n"
    lines = [
        tuple(map(int, line.split()))
        for line in _id_map(65534, keep_others=True).split("\n")
        if line
    ]
    assert lines[:2] == [(0, 65534, 1), (65534, 0, 1)]
    assert sum(n for _a, _b, n in lines) == (1 << 32) - 1  # every id but -1, once
    assert all(a == b for a, b, _n in lines[2:])


def test_warm_host_scans_looks_at_the_host_before_the_first_task(tmp_path: Path) -> None:
    root = host(tmp_path)
    sandbox.warm_host_scans(root)
    misses = hostscan._scan_root_only.cache_info().misses
    assert misses == len([rel for rel in IDMAPPED if (root / rel).is_dir()])
    found = hostscan._scan_root_only(str(root), "usr")  # what a task's plan asks for next
    assert hostscan._scan_root_only.cache_info().misses == misses  # answered from the warm scan
    assert ("/usr/local/etc/token", False) in found


def test_warm_host_scans_never_raises_on_a_missing_host(tmp_path: Path) -> None:
    sandbox.warm_host_scans(tmp_path / "nothing-here")
    assert hostscan._scan_root_only.cache_info().misses == 0
