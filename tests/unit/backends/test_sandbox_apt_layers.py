"""What a remapped task gets so that ``apt-get install`` works in its private root (issue
11): the skeleton layer that makes the open folders of ``/etc`` and the top of ``/var`` the
task's (never a closed folder, never a file), the ``FRESH`` folders and files and the layer
that shows each, and what stays covered. Without processes; the real sandbox:
tests/integration/engine/test_sandbox_apt_install.py."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest

from trainyard.backends.local import hostscan, layers, sandbox
from trainyard.backends.local.sandbox import (
    IDMAPPED,
    OPAQUE_XATTR,
    SandboxPlan,
    fresh_layer,
    fresh_paths,
    idmapped_covers,
    overlays,
    skeleton_base,
    system_skeleton,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the fake host's files must be root's and the skeleton's folders another uid's (chown)",
)

TASK_UID = 65534


@pytest.fixture(autouse=True)
def _fresh_scans() -> None:
    hostscan._scan_root_only.cache_clear()
    layers._skeleton_dirs.cache_clear()
    layers._fresh_entries.cache_clear()


def host(tmp_path: Path) -> Path:
    """A fake host ``/`` with apt's and dpkg's folders and some of ``/etc``'s kinds."""
    root = tmp_path / "host"
    for folder in (
        "usr/bin",
        "etc/ld.so.conf.d",
        "etc/apt/apt.conf.d",
        "etc/munge/inner",
        "var/lib/dpkg",
        "var/lib/apt/lists",
        "var/cache/apt/archives",
        "var/lib/pkg/deep/deeper",
        "var/log/apt",
    ):
        (root / folder).mkdir(parents=True)
    (root / "etc/munge").chmod(0o700)
    (root / "etc/listonly").mkdir(mode=0o711)
    (root / "etc/listonly").chmod(0o711)  # others may pass but not list it
    (root / "etc/shadow").write_text("root:secret\n")
    (root / "etc/shadow").chmod(0o600)
    for partial in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial"):
        (root / partial).mkdir()
        (root / partial).chmod(0o700)
    (root / "var/lib/apt/lists/secret").write_text("x\n")
    (root / "var/lib/apt/lists/secret").chmod(0o600)
    (root / "var/log/dpkg.log").write_text("host history\n")
    return root


def plan(tmp_path: Path, **fields: object) -> SandboxPlan:
    run = tmp_path / "run" / "sandbox"
    fields.setdefault("skeleton_dir", tmp_path / "skeletons")
    return SandboxPlan(
        root_dir=run / "root",
        hostname="t",
        host_root=host(tmp_path),
        overlay_dir=run / "overlay",
        idmapped=IDMAPPED,
        **fields,
    )  # type: ignore[arg-type]


def _tree(top: Path) -> dict[str, tuple[int, int, int]]:
    found = {}
    for folder, dirs, files in os.walk(top):
        assert not files, files  # folders only
        for name in dirs:
            info = os.lstat(Path(folder) / name)
            found[os.path.relpath(Path(folder) / name, top)] = (
                info.st_uid,
                info.st_gid,
                stat.S_IMODE(info.st_mode),
            )
    return found


def test_the_skeleton_gives_open_folders_only_never_closed_ones_nor_files(
    tmp_path: Path,
) -> None:
    made = plan(tmp_path, host_uid=TASK_UID)
    layer = system_skeleton(made.skeleton_dir, made.host_root, TASK_UID)  # type: ignore[arg-type]
    assert layer is not None and layer.parent == made.skeleton_dir
    tree = _tree(layer)
    assert tree["etc"] == (TASK_UID, TASK_UID, 0o755)
    assert tree["etc/ld.so.conf.d"] == tree["etc/apt/apt.conf.d"] == (TASK_UID, TASK_UID, 0o755)
    assert tree["var/lib"] == tree["var/lib/pkg"] == (TASK_UID, TASK_UID, 0o755)
    for closed in (
        "etc/munge",
        "etc/munge/inner",
        "etc/listonly",
        "etc/shadow",
        "var/lib/pkg/deep",  # deeper than SKELETON's 2 levels of /var
        "var/log/apt",  # FRESH: the task's own, empty, not the host's
        "usr",
        "usr/bin",
    ):  # not in SKELETON (idmapped)
        assert closed not in tree, closed
    again = system_skeleton(made.skeleton_dir, made.host_root, TASK_UID)  # type: ignore[arg-type]
    assert again == layer and len(list(layer.parent.iterdir())) == 1  # made once per content


def test_the_skeleton_is_stacked_over_the_root_layer_of_a_remapped_task_only(
    tmp_path: Path,
) -> None:
    remapped = plan(tmp_path, host_uid=TASK_UID)
    root_layer = overlays(remapped)[0]
    assert root_layer.lower == str(remapped.host_root) and len(root_layer.lower_above) == 2
    skeleton, fresh = map(Path, root_layer.lower_above)  # the skeleton above the fresh layer
    assert skeleton.parent == fresh.parent == remapped.skeleton_dir
    assert fresh.name.startswith("fresh-")
    assert [o.lower_above for o in overlays(remapped)[1:]] == [  # idmapped: the fresh layer's
        [] if rel == "usr" or rel == "var/lib/dpkg" else [str(fresh / rel)] for rel in IDMAPPED
    ]
    plain = SandboxPlan(
        root_dir=remapped.root_dir,
        hostname="t",
        host_root=remapped.host_root,
        overlay_dir=remapped.overlay_dir,
        idmapped=IDMAPPED,
        skeleton_dir=remapped.skeleton_dir,
    )
    assert overlays(plain)[0].lower_above == []  # uid 0 inside is the host's: nothing to give


def test_fresh_paths_lie_in_the_layer_that_shows_them_and_are_not_covered(
    tmp_path: Path,
) -> None:
    made = plan(tmp_path, host_uid=TASK_UID, skeleton_dir=None)  # no fresh layer: made per task
    mnt = made.overlay_dir / "rootfs" / "mnt"  # type: ignore[operator]
    fresh = {(f.base, f.relative): (f.is_dir, f.mode, f.text) for f in fresh_paths(made)}
    assert fresh == {
        (str(mnt / "var/lib/apt"), "lists/partial"): (True, 0o700, ""),
        (str(mnt / "var/lib/apt"), "lists/auxfiles"): (True, 0o755, ""),
        (str(mnt / "var/cache/apt"), "archives/partial"): (True, 0o700, ""),
        (str(mnt / "var"), "log/apt"): (True, 0o755, ""),
        (str(mnt / "var"), "log/dpkg.log"): (False, 0o644, ""),
        (str(mnt / "etc"), "apt/apt.conf.d/99trainyard-sandbox"): (
            False,
            0o644,
            'APT::Sandbox::User "root";\n',
        ),
        (str(mnt / "etc"), "shadow"): (False, 0o600, "root:*\n"),  # account_entries
        (str(mnt / "etc"), ".pwd.lock"): (False, 0o600, ""),
    }
    covers = dict(idmapped_covers(made))
    assert "/var/lib/apt/lists/partial" not in covers  # replaced by the task's own
    assert "/var/cache/apt/archives/partial" not in covers
    assert covers["/var/lib/apt/lists/secret"] is False  # root's, closed: still covered
    assert (
        fresh_paths(
            SandboxPlan(
                root_dir=made.root_dir,
                hostname="t",
                host_root=made.host_root,
                overlay_dir=made.overlay_dir,
                idmapped=IDMAPPED,
            )
        )
        == []
    )  # no remap: none


def _layer_tree(top: Path) -> dict[str, tuple[bool, int, int, int, bool, str]]:
    """(is a folder, uid, gid, mode, opaque, text) of each entry below ``top``."""
    found = {}
    for folder, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            info = os.lstat(path)
            is_dir = stat.S_ISDIR(info.st_mode)
            found[os.path.relpath(path, top)] = (
                is_dir,
                info.st_uid,
                info.st_gid,
                stat.S_IMODE(info.st_mode),
                OPAQUE_XATTR in os.listxattr(path, follow_symlinks=False),
                "" if is_dir else path.read_text(),
            )
    return found


def test_the_fresh_layer_holds_apts_fresh_entries_opaque_and_the_tasks_once(
    tmp_path: Path,
) -> None:
    made = plan(tmp_path, host_uid=TASK_UID)
    (made.host_root / "var/log").chmod(0o751)
    (made.host_root / "var/lib/apt/lists").chmod(0o750)  # seen idmapped: root's is the task's
    (made.host_root / "var/lib/apt/lists/auxfiles").mkdir()  # the host's: hidden below
    (made.host_root / "var/lib/apt/lists/auxfiles/old").write_text("host's\n")
    idmapped = tuple(layers._idmapped(made))
    layer = fresh_layer(made.skeleton_dir, made.host_root, TASK_UID, idmapped)  # type: ignore[arg-type]
    assert layer is not None and layer.parent == made.skeleton_dir
    tree = _layer_tree(layer)
    task, root = (TASK_UID, TASK_UID), (0, 0)
    assert tree == {
        "etc": (True, *root, 0o755, False, ""),
        "etc/apt": (True, *root, 0o755, False, ""),
        "etc/apt/apt.conf.d": (True, *root, 0o755, False, ""),
        "etc/apt/apt.conf.d/99trainyard-sandbox": (
            False,
            *task,
            0o644,
            False,
            'APT::Sandbox::User "root";\n',
        ),
        "etc/shadow": (False, *task, 0o600, False, "root:*\n"),  # scrubbed, the task's
        "etc/.pwd.lock": (False, *task, 0o600, False, ""),
        "var": (True, *root, 0o755, False, ""),
        "var/log": (True, *root, 0o751, False, ""),
        "var/log/apt": (True, *task, 0o755, True, ""),
        "var/log/dpkg.log": (False, *task, 0o644, False, ""),
        "var/lib": (True, *root, 0o755, False, ""),
        "var/lib/apt": (True, *root, 0o755, False, ""),
        "var/lib/apt/lists": (True, *task, 0o750, False, ""),
        "var/lib/apt/lists/partial": (True, *task, 0o700, True, ""),
        "var/lib/apt/lists/auxfiles": (True, *task, 0o755, True, ""),
        "var/cache": (True, *root, 0o755, False, ""),
        "var/cache/apt": (True, *root, 0o755, False, ""),
        "var/cache/apt/archives": (True, *task, 0o755, False, ""),
        "var/cache/apt/archives/partial": (True, *task, 0o700, True, ""),
    }
    assert fresh_paths(made) == []  # nothing left to make per task
    again = fresh_layer(made.skeleton_dir, made.host_root, TASK_UID, idmapped)  # type: ignore[arg-type]
    assert again == layer and len(list(layer.parent.iterdir())) == 1  # made once per content


def test_the_fresh_layer_leaves_out_what_the_host_has_no_parent_for(tmp_path: Path) -> None:
    made = plan(tmp_path, host_uid=TASK_UID)
    (made.host_root / "etc/apt/apt.conf.d").rmdir()  # no apt settings folder
    (made.host_root / "var/cache/apt/archives/partial").rmdir()
    (made.host_root / "var/cache/apt/archives").rmdir()
    (made.host_root / "var/cache/apt/archives").symlink_to("/root")  # a link: not followed
    layer = fresh_layer(made.skeleton_dir, made.host_root, TASK_UID)  # type: ignore[arg-type]
    assert layer is not None
    tree = _layer_tree(layer)
    assert "etc/apt/apt.conf.d/99trainyard-sandbox" not in tree and "etc/apt" not in tree
    assert not any(rel.startswith("var/cache") for rel in tree)
    assert "var/log/apt" in tree


def test_without_a_fresh_layer_the_runner_makes_the_fresh_entries_per_task(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(*_args: object, **_kwargs: object) -> None:
        raise OSError(95, "Operation not supported")  # a file system without trusted xattrs

    monkeypatch.setattr(sandbox.os, "setxattr", refused)
    made = plan(tmp_path, host_uid=TASK_UID)
    assert sandbox.fresh_layer(made.skeleton_dir, made.host_root, TASK_UID) is None  # type: ignore[arg-type]
    assert [p.name for p in made.skeleton_dir.iterdir()] == []  # nothing half-made kept
    assert len(fresh_paths(made)) == 8  # the fallback: make_fresh in each task's layers
    # (FRESH's 6, the fake host's /etc/shadow and shadow-utils' lock)
    root_layer, *idmapped = overlays(made)
    assert len(root_layer.lower_above) == 1 and all(not o.lower_above for o in idmapped)


def test_skeleton_base_is_a_closed_folder_of_ours_on_another_file_system(
    tmp_path: Path,
) -> None:
    same_fs = tmp_path / "skeletons"
    assert skeleton_base(same_fs, tmp_path) is None  # overlayfs would refuse it
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is not a file system of its own here")
    base = shm / f"trainyard-test-{uuid.uuid4().hex}"
    try:
        assert skeleton_base(base, tmp_path) == base
        assert stat.S_IMODE(base.stat().st_mode) == 0o700
        opened = shm / f"trainyard-test-{uuid.uuid4().hex}"
        opened.mkdir()
        opened.chmod(0o755)
        assert skeleton_base(opened, tmp_path) is None  # not closed to others: not trusted
        opened.rmdir()
    finally:
        base.rmdir()


def test_warm_host_scans_also_looks_at_the_skeletons_folders(tmp_path: Path) -> None:
    root = host(tmp_path)
    sandbox.warm_host_scans(root)
    assert layers._skeleton_dirs.cache_info().misses == 1
    system_skeleton(tmp_path / "skeletons", root, TASK_UID)
    assert layers._skeleton_dirs.cache_info().misses == 1  # the first task does not walk
