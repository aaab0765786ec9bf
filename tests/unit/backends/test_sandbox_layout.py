"""The sandbox plan without processes: which folders get a private layer, what the runner
maps where, and the task's links removed before bwrap makes mount points through them."""

from __future__ import annotations

import os
from pathlib import Path

from trainyard.backends.local.sandbox import (
    PRIVILEGE_ARGS,
    SandboxPlan,
    bwrap_argv,
    clear_links,
    overlays,
    sandbox_mounts,
)


def host(tmp_path: Path) -> Path:
    """A fake host ``/``: system folders, a link, and folders a task must never see."""
    root = tmp_path / "host"
    for folder in ("usr/bin", "etc/ssl", "var/tmp", "opt/x", "work/secret", "root/.ssh", "home/u"):
        (root / folder).mkdir(parents=True)
    (root / "boot").mkdir()  # empty
    (root / "bin").symlink_to("usr/bin")
    return root


def plan(tmp_path: Path, **fields: object) -> SandboxPlan:
    sandbox = tmp_path / "run" / "sandbox"
    return SandboxPlan(
        root_dir=sandbox / "root",
        hostname="t",
        host_root=host(tmp_path),
        overlay_dir=sandbox / "overlay",
        **fields,
    )  # type: ignore[arg-type]


def test_system_folders_get_a_private_layer_and_nothing_else_is_shown(tmp_path: Path) -> None:
    made = plan(tmp_path)
    assert [o.lower for o in overlays(made)] == [str(made.host_root)]  # one layer: one mount
    argv = bwrap_argv(made)
    shown = {argv[i + 2] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")}
    assert {"/usr", "/etc", "/var", "/opt"} <= shown
    assert not shown & {"/work", "/root", "/home"}
    assert ("--dir", "/root") in zip(argv, argv[1:], strict=False) and ("--dir", "/boot") in zip(
        argv, argv[1:], strict=False
    )
    assert " ".join(PRIVILEGE_ARGS) in " ".join(argv)
    mounts, readonly = sandbox_mounts(made)
    assert mounts["/bin"] == f"{made.overlay_dir}/rootfs/mnt/usr/bin" and "/bin" not in readonly
    assert mounts["/etc"] == f"{made.overlay_dir}/rootfs/mnt/etc"
    assert "/work" not in mounts and readonly == []


def test_without_a_layer_system_folders_are_read_only(tmp_path: Path) -> None:
    made = SandboxPlan(root_dir=tmp_path / "r", hostname="t", host_root=host(tmp_path))
    assert overlays(made) == []
    mounts, readonly = sandbox_mounts(made)
    assert mounts["/usr"] == str(made.host_root / "usr") and {"/usr", "/bin"} <= set(readonly)


def test_a_system_folder_holding_the_home_is_read_only_with_the_home_covered(
    tmp_path: Path,
) -> None:
    base = host(tmp_path)
    made = SandboxPlan(
        root_dir=Path("/var/lib/ty/runs/w/t/0/sandbox/root"),
        hostname="t",
        host_root=base,
        overlay_dir=Path("/var/lib/ty/runs/w/t/0/sandbox/overlay"),
        hidden=("/var/lib/ty", "/srv/elsewhere"),
        writable=("/var/lib/ty/runs/w/t/0/output",),
    )
    argv = bwrap_argv(made)
    assert ("--ro-bind", str(base / "var"), "/var") in zip(argv, argv[1:], argv[2:], strict=False)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"] == ["/var/lib/ty"]
    assert argv.index("/var/lib/ty") < argv.index("/var/lib/ty/runs/w/t/0/output")
    assert sandbox_mounts(made)[0]["/var"] == str(base / "var")  # not a layer: read-only


def test_system_folders_on_the_root_file_system_share_one_layer(tmp_path: Path) -> None:
    made = SandboxPlan(root_dir=tmp_path / "root", hostname="t", overlay_dir=tmp_path / "o")
    layers = overlays(made)
    assert layers[0].lower == "/" and layers[0].target == str(tmp_path / "o" / "rootfs" / "mnt")
    mounts, _ = sandbox_mounts(made)
    if not os.path.ismount("/usr"):
        assert mounts["/usr"] == str(tmp_path / "o" / "rootfs" / "mnt" / "usr")


def test_links_the_task_left_where_bwrap_mounts_are_removed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    made = plan(tmp_path, readonly=("/work/venv",), volumes=(("/data", "/opt/shared"),))
    root, upper = made.root_dir, made.overlay_dir / "rootfs" / "upper" / "opt"  # type: ignore[operator]
    root.mkdir(parents=True)
    upper.mkdir(parents=True)
    os.symlink(outside, root / "work")  # a bind at /work/venv would follow it
    os.symlink(outside, root / "root")  # --dir /root too
    os.symlink(outside, upper / "shared")  # the volume's mount point, in /opt's layer
    (root / "tmp").write_text("not a folder")
    removed = clear_links(made)
    assert sorted(removed) == ["/opt/shared", "/root", "/tmp", "/work/venv"]
    assert not any(p.is_symlink() for p in (root / "work", root / "root", upper / "shared"))
    assert list(outside.iterdir()) == []


def test_with_a_host_uid_the_runner_maps_it_and_bwrap_drops_every_capability(
    tmp_path: Path,
) -> None:
    from trainyard.backends.local.sandbox import REMAP_ARGS, bwrap_end, task_owned

    root = tmp_path / "root"
    plan = SandboxPlan(
        root_dir=root,
        hostname="t",
        host_uid=65534,
        writable=(str(tmp_path / "deep" / "out"),),
        volumes=((str(tmp_path), "/mnt/shared/team"),),
    )
    argv = bwrap_argv(plan)
    end = bwrap_end(argv)
    assert argv[end] == "--" and "--disable-userns" not in argv
    joined = " ".join(argv[:end])
    assert " ".join(REMAP_ARGS) in joined and "--cap-add" not in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[end + 1 :] == []  # the command follows bwrap's `--`: no setpriv in between
    dirs = [
        argv[i + 3]
        for i, a in enumerate(argv[:end])
        if a == "--perms" and argv[i + 1] == "0755" and argv[i + 2] == "--dir"
    ]
    assert "/mnt" in dirs and "/mnt/shared" in dirs  # bwrap would make them 0700
    own, below = task_owned(plan)
    assert str(root) in own and str(root / "tmp") in own and str(root / "root") in own
    assert below == [] or all(p.endswith("/usr/local") for p in below)
    assert bwrap_end(["nsenter", "--net=/x", "--", *argv]) == end + 3


def test_without_a_host_uid_the_hosts_unreadable_files_are_covered(tmp_path: Path) -> None:
    from trainyard.backends.local.sandbox import secret_covers

    host = tmp_path / "host"
    (host / "etc" / "ssh").mkdir(parents=True)
    (host / "etc" / "munge").mkdir(mode=0o700)
    (host / "etc" / "munge").chmod(0o700)
    (host / "etc" / "munge" / "munge.key").write_text("k")
    (host / "etc" / "shadow").write_text("s")
    (host / "etc" / "shadow").chmod(0o640)
    (host / "etc" / "ssh" / "ssh_host_ed25519_key").write_text("k")
    (host / "etc" / "ssh" / "ssh_host_ed25519_key").chmod(0o600)
    (host / "etc" / "passwd").write_text("p")
    (host / "etc" / "passwd").chmod(0o644)
    (host / "var" / "lib" / "deep").mkdir(parents=True)
    (host / "var" / "lib" / "deep" / "k").write_text("k")
    (host / "var" / "lib" / "deep" / "k").chmod(0o600)  # below the scanned depth
    covers = dict(secret_covers(host))
    assert covers == {
        "/etc/munge": True,
        "/etc/shadow": False,
        "/etc/ssh/ssh_host_ed25519_key": False,
    }
    argv = bwrap_argv(SandboxPlan(root_dir=tmp_path / "root", hostname="t", host_root=host))
    assert ["--ro-bind", "/dev/null", "/etc/shadow"] == argv[
        argv.index("/etc/shadow") - 2 : argv.index("/etc/shadow") + 1
    ]
    assert ["--tmpfs", "/etc/munge", "--remount-ro", "/etc/munge"] == argv[
        argv.index("/etc/munge") - 1 : argv.index("/etc/munge") + 3
    ]
    remapped = bwrap_argv(
        SandboxPlan(root_dir=tmp_path / "root", hostname="t", host_root=host, host_uid=65534)
    )
    assert "/etc/shadow" not in remapped
