"""A remapped task's own account files (issue 11: ``groupadd``, ``useradd``, ``adduser`` in a
postinst or a setup script): the host's passwd and group as they are, shadow and gshadow
with every password field replaced, their backups likewise, shadow-utils' lock file, all in
the fresh layer (or made per task without one). Without processes; the real sandbox:
tests/integration/engine/test_sandbox_apt_install.py (the tests at its end)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.backends.local import layers
from trainyard.backends.local.sandbox import (
    IDMAPPED,
    PWD_LOCK,
    SandboxPlan,
    account_entries,
    fresh_layer,
    fresh_paths,
    scrub_passwords,
)

TASK_UID = 65534

SHADOW = (
    "root:$y$j9T$salt$hash:19500:0:99999:7:::\n"
    "daemon:*:19500:0:99999:7:::\n"
    "locked:!$6$salt$hash:19500:0:99999:7:::\n"
    "nopass::19500:0:99999:7:::\n"
    "# a comment\n"
    "\n"
    "short:$1$x$y\n"
)
GSHADOW = "root:*::\nadm:$6$s$h:alice:bob,carol\nsudo:!::alice\n"


def test_every_password_field_is_replaced_and_nothing_else() -> None:
    assert scrub_passwords(SHADOW) == (
        "root:*:19500:0:99999:7:::\n"
        "daemon:*:19500:0:99999:7:::\n"
        "locked:!:19500:0:99999:7:::\n"
        "nopass:*:19500:0:99999:7:::\n"
        "short:*\n"
    )
    assert scrub_passwords(GSHADOW) == "root:*::\nadm:*:alice:bob,carol\nsudo:!::alice\n"
    assert scrub_passwords("") == ""


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_no_password_field_survives_any_text(text: str) -> None:
    scrubbed = scrub_passwords(text)
    for line in scrubbed.splitlines():
        assert line.split(":")[1] in ("*", "!"), line
    fields = {line.partition(":")[2].partition(":")[0] for line in text.splitlines()}
    for field in fields - {"", "*", "!"}:  # no password of the input is left in a field
        assert all(line.split(":")[1] != field for line in scrubbed.splitlines())


def _host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    files = {
        "passwd": ("root:x:0:0:root:/root:/bin/bash\n", 0o644),
        "passwd-": ("root:x:0:0:root:/root:/bin/sh\n", 0o644),
        "group": ("root:x:0:\n", 0o644),
        "shadow": (SHADOW, 0o640),
        "shadow-": (SHADOW, 0o600),
        "gshadow": (GSHADOW, 0o640),
        "subuid": ("", 0o644),
    }
    for name, (text, mode) in files.items():
        (root / "etc" / name).write_text(text)
        (root / "etc" / name).chmod(mode)
    (root / "etc/subgid").symlink_to("/etc/shadow")  # a link: never followed
    (root / "etc/group-").write_bytes(b"caf\xe9:x:1:\n")  # not UTF-8: left out
    return root


@pytest.fixture(autouse=True)
def _fresh_scans() -> None:
    account_entries.cache_clear()
    layers._fresh_entries.cache_clear()
    layers._skeleton_dirs.cache_clear()


def test_the_account_files_are_copied_with_the_hosts_modes_secrets_scrubbed(
    tmp_path: Path,
) -> None:
    entries = {
        rel: (is_dir, mode, text)
        for rel, is_dir, mode, text in account_entries(str(_host(tmp_path)))
    }
    assert entries == {
        "etc/passwd": (False, 0o644, "root:x:0:0:root:/root:/bin/bash\n"),
        "etc/passwd-": (False, 0o644, "root:x:0:0:root:/root:/bin/sh\n"),
        "etc/group": (False, 0o644, "root:x:0:\n"),
        "etc/shadow": (False, 0o640, scrub_passwords(SHADOW)),
        "etc/shadow-": (False, 0o600, scrub_passwords(SHADOW)),
        "etc/gshadow": (False, 0o640, scrub_passwords(GSHADOW)),
        "etc/subuid": (False, 0o644, ""),
        PWD_LOCK[0]: (False, 0o600, ""),
    }
    assert not any("$" in text for _d, _m, text in entries.values())


@pytest.mark.skipif(os.geteuid() != 0, reason="only root reads a 0000 file (as the backend)")
def test_a_shadow_file_closed_to_its_owner_is_given_readable_and_writable(
    tmp_path: Path,
) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/shadow").write_text(SHADOW)
    (tmp_path / "etc/shadow").chmod(0o000)  # Fedora's: only CAP_DAC_OVERRIDE reads it
    entries = {rel: mode for rel, _d, mode, _t in account_entries(str(tmp_path))}
    assert entries["etc/shadow"] == 0o600  # the task's root has no such capability


def test_a_host_without_account_files_gives_none_not_even_the_lock(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    assert account_entries(str(tmp_path)) == ()


def _plan(host_root: Path, tmp_path: Path, skeleton_dir: Path | None) -> SandboxPlan:
    run = tmp_path / "run" / "sandbox"
    return SandboxPlan(
        root_dir=run / "root",
        hostname="t",
        host_root=host_root,
        overlay_dir=run / "overlay",
        idmapped=IDMAPPED,
        host_uid=TASK_UID,
        skeleton_dir=skeleton_dir,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the layer's files are chowned to the task's uid")
def test_the_fresh_layer_holds_the_tasks_copies_and_no_hash(tmp_path: Path) -> None:
    host = _host(tmp_path)
    layer = fresh_layer(tmp_path / "skeletons", host, TASK_UID)
    assert layer is not None
    shadow = layer / "etc/shadow"
    info = shadow.lstat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (TASK_UID, TASK_UID, 0o640)
    assert shadow.read_text() == scrub_passwords(SHADOW)
    assert (layer / "etc/.pwd.lock").read_text() == ""
    assert not (layer / "etc/subgid").exists()  # the host's is a link: left as it is
    for folder, _dirs, names in os.walk(layer):
        for name in names:
            assert "$" not in (Path(folder) / name).read_text(), name
    made = _plan(host, tmp_path, tmp_path / "skeletons")
    assert not [p for p in fresh_paths(made) if p.relative in ("shadow", "passwd")]


def test_without_a_fresh_layer_the_runner_makes_the_copies_per_task(tmp_path: Path) -> None:
    made = _plan(_host(tmp_path), tmp_path, None)
    view = str(made.overlay_dir / "rootfs" / "mnt" / "etc")  # type: ignore[operator]
    fresh = {p.relative: (p.base, p.is_dir, p.mode, p.text) for p in fresh_paths(made)}
    assert fresh["shadow"] == (view, False, 0o640, scrub_passwords(SHADOW))
    assert fresh["passwd"] == (view, False, 0o644, "root:x:0:0:root:/root:/bin/bash\n")
    assert fresh[".pwd.lock"] == (view, False, 0o600, "")
