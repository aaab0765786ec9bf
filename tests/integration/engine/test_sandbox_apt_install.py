"""``apt-get update && apt-get install -y PKG`` works in a task's private root, as in a pod
(issue 11, "Private writable root per attempt"; OSMO's tutorial
``tutorials/robot_simulation.yaml`` does it), and changes nothing on the host.

It failed before: apt drops to its ``_apt`` user (a task has no capability to), its lock
files and download folders (``/var/lib/apt``, ``/var/cache/apt``) were the host root's, and
dpkg could not add a conffile to a folder of ``/etc`` (``/etc/ld.so.conf.d``) nor a line to
its log. Now the runner writes ``APT::Sandbox::User "root"`` into the task's layer, apt's
folders are idmapped like dpkg's, its download folders and logs are fresh ones of the
task's, and the folders (never the files) of ``/etc`` and the top of ``/var`` are the
task's (``sandbox.system_skeleton``), so root's secrets there stay unreadable (the test
plants a folder of root's closed to others in ``/etc``, holding a file others may read:
neither is readable inside). The account files are the task's own copies
(``sandbox.account_entries``), ``/etc/shadow`` and ``/etc/gshadow`` scrubbed: a postinst
that runs ``groupadd``/``useradd`` works, and no hash of the host's is readable (the tests
at the end).

No network: the test builds a tiny package (a conffile in ``/etc``, one in
``/etc/ld.so.conf.d``, a postinst that appends to its conffile and runs ``ldconfig``) and a
flat ``file:`` repository (its ``Packages`` written here, no ``dpkg-dev`` needed), bound into
the task as an allowed ``volumeMounts`` folder; ``apt-get update`` reads only that source.
RESTART keeps the installed package, RESCHEDULE starts from a fresh root without it.
Through the real engine, the local backend and its bubblewrap sandbox, as root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

from trainyard.backends.local import layers, sandbox
from trainyard.status import WorkflowStatus

SPEC = """
workflow:
  name: apt-install
  tasks:
  - name: t
    exitActions:
      {{action}}: 42
    environment:
      PKG: "{{pkg}}"
    volumeMounts:
    - "{{repo}}:/srv/tinyrepo"
    command:
    - sh
    - -c
    - |
      set -e
      o="{{output}}"
      if [ "$TRAINYARD_RETRY_ID" = 0 ]; then
        for d in /var/log/apt /var/lib/apt/lists/partial /var/cache/apt/archives/partial; do
          echo "$d $(stat -c %u:%a "$d") $(ls -A "$d" | wc -l)" >> "$o/r0-fresh"
        done
        echo "dpkg.log $(stat -c %u:%a /var/log/dpkg.log) $(wc -c < /var/log/dpkg.log)" >> "$o/r0-fresh"
        echo "deb [trusted=yes] file:/srv/tinyrepo ./" > /etc/apt/sources.list.d/$PKG.list
        apt-get update -o Dir::Etc::SourceList=/etc/apt/sources.list.d/$PKG.list \\
          -o Dir::Etc::SourceParts=- -o APT::Get::List-Cleanup=0
        apt-get install -y --no-install-recommends "$PKG"
        dpkg -s "$PKG" | grep '^Status:' > "$o/r0-status"
        cat /usr/share/$PKG/file > "$o/r0-file"
        cat /etc/$PKG.conf > "$o/r0-conf"
        cat /etc/ld.so.conf.d/$PKG.conf > "$o/r0-ldconf"
        for f in /var/cache/debconf/passwords.dat /etc/$PKG-closed/inner; do
          cat "$f" >> "$o/r0-read" 2>/dev/null || true
        done
        ls /etc/$PKG-closed >> "$o/r0-read" 2>/dev/null || true
        exit 42
      fi
      if dpkg -s "$PKG" >/dev/null 2>&1 && [ -e /usr/share/$PKG/file ]; then
        echo installed > "$o/r1-after"
      else
        echo absent > "$o/r1-after"
      fi
      grep -c " install $PKG" /var/log/dpkg.log > "$o/r1-dpkglog" || true
"""

CONTROL = """Package: {pkg}
Version: 1.0
Architecture: all
Maintainer: trainyard tests <tests@trainyard.invalid>
Description: a tiny package for trainyard's apt test
"""

POSTINST = """#!/bin/sh
set -e
echo "configured=yes" >> /etc/{pkg}.conf
ldconfig
"""

HOST_FILES = (
    "/var/lib/dpkg/status",
    "/var/log/dpkg.log",
    "/etc/ld.so.cache",
    "/var/log/apt/history.log",
    "/var/log/apt/term.log",
)
HOST_FOLDERS = (
    "/etc/apt/sources.list.d",
    "/etc/ld.so.conf.d",
    "/var/lib/apt/lists",
    "/var/cache/apt/archives",
    "/var/log/apt",
    "/etc",
)


def _build_repo(folder: Path, pkg: str, postinst: str | None = None) -> None:
    """A flat repository in ``folder``: ``PKG_1.0_all.deb`` (its maintainer script
    ``postinst``, ``POSTINST`` by default) and its ``Packages`` index."""
    src = folder.parent / "src"
    for sub in ("DEBIAN", f"usr/share/{pkg}", "etc/ld.so.conf.d"):
        (src / sub).mkdir(parents=True)
    (src / f"usr/share/{pkg}/file").write_text("installed\n")
    (src / f"etc/{pkg}.conf").write_text("shipped=yes\n")
    (src / f"etc/ld.so.conf.d/{pkg}.conf").write_text(f"/usr/lib/{pkg}\n")
    control = CONTROL.format(pkg=pkg)
    (src / "DEBIAN/control").write_text(control)
    (src / "DEBIAN/conffiles").write_text(f"/etc/{pkg}.conf\n/etc/ld.so.conf.d/{pkg}.conf\n")
    (src / "DEBIAN/postinst").write_text(postinst or POSTINST.format(pkg=pkg))
    (src / "DEBIAN/postinst").chmod(0o755)
    folder.mkdir()
    deb = folder / f"{pkg}_1.0_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(src), str(deb)],
        check=True,
        capture_output=True,
    )
    data = deb.read_bytes()
    (folder / "Packages").write_text(
        control + f"Filename: ./{deb.name}\nSize: {len(data)}\n"
        f"SHA256: {hashlib.sha256(data).hexdigest()}\n\n"
    )


def _host_state(pkg: str) -> dict[str, str]:
    """What the host has where a package install writes: file digests, folder listings
    (without what other tests running beside this one plant: ``trainyard-*`` not ours)."""
    state = {}
    for name in HOST_FILES:
        path = Path(name)
        state[name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "-"
    for name in HOST_FOLDERS:
        path = Path(name)
        entries = os.listdir(path) if path.is_dir() else ["-"]
        state[name] = " ".join(
            sorted(e for e in entries if pkg in e or not e.startswith("trainyard-"))
        )
    return state


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for tool in ("apt-get", "dpkg", "dpkg-deb", "ldconfig"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (not a Debian host)")
    return tmp_path / "repos"


@pytest.fixture
def run(tmp_path: Path, repo: Path) -> Iterator[EngineRun]:
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("the private layers and the uid remap need a server running as root")
    if sandbox.probe_remap() is not None:
        pytest.skip(f"no uid remap here: {sandbox.probe_remap()}")
    if sandbox.skeleton_base() is None:
        pytest.skip(
            f"{sandbox.SKELETON_BASE} cannot hold the skeleton layer here (not a tmpfs of root's)"
        )
    repo.mkdir()
    home = tmp_path / "home dir"
    home.mkdir()
    made = EngineRun(home, allowed_mounts=[str(repo)])
    yield made
    made.close()


@pytest.mark.parametrize(
    ("action", "after"),
    [
        ("RESTART", "installed"),  # the same root: the package is still there
        ("RESCHEDULE", "absent"),  # a fresh root: it is not
    ],
)
def test_apt_get_installs_a_package_into_the_private_root_only(
    run: EngineRun,
    repo: Path,
    action: str,
    after: str,
) -> None:
    pkg = f"trainyard-tiny-{uuid.uuid4().hex[:10]}"
    _build_repo(repo / pkg, pkg)
    before = _host_state(pkg)
    closed = Path(f"/etc/{pkg}-closed")  # root's, closed to others: never the task's
    closed.mkdir(mode=0o700)
    (closed / "inner").write_text("readable by mode, hidden by its folder\n")
    (closed / "inner").chmod(0o644)
    layers._skeleton_dirs.cache_clear()  # the skeleton looks at the host once per process
    try:
        wid = run.run(SPEC, action=action, pkg=pkg, repo=str(repo / pkg))
    finally:
        shutil.rmtree(closed)
        layers._skeleton_dirs.cache_clear()
    log = run.log(wid, "t") + run.log(wid, "t", 1)
    assert run.engine.state(wid).status is WorkflowStatus.COMPLETED, log
    first = run.engine.run_dir(wid, "t", 1 if action == "RESTART" else 0) / "output"
    # apt's folders and logs start empty and the task's (the host's have entries and lines)
    assert (first / "r0-fresh").read_text() == (
        "/var/log/apt 0:755 0\n/var/lib/apt/lists/partial 0:700 0\n"
        "/var/cache/apt/archives/partial 0:700 0\ndpkg.log 0:644 0\n"
    ), log
    assert (first / "r0-status").read_text() == "Status: install ok installed\n", log
    assert (first / "r0-file").read_text() == "installed\n", log
    assert (first / "r0-conf").read_text() == "shipped=yes\nconfigured=yes\n", log  # postinst
    assert (first / "r0-ldconf").read_text() == f"/usr/lib/{pkg}\n", log
    read = (first / "r0-read").read_text() if (first / "r0-read").exists() else ""
    assert read == "", f"a task read debconf's passwords.dat or {closed}"
    warnings = [line for line in run.log(wid, "t").splitlines() if "] W: " in line]
    # apt chowns its terminal log to group adm, which is not mapped: a warning it lives with
    assert all("/var/log/apt/term.log" in line for line in warnings), log
    last = run.engine.run_dir(wid, "t", 1) / "output"
    assert (last / "r1-after").read_text() == f"{after}\n", log
    # dpkg's log the task wrote: kept by RESTART (its upper layer), fresh after RESCHEDULE
    assert (last / "r1-dpkglog").read_text() == ("1\n" if after == "installed" else "0\n"), log
    assert _host_state(pkg) == before  # dpkg's state, /etc, apt's lists and logs unchanged
    assert not Path(f"/usr/share/{pkg}").exists() and not Path(f"/etc/{pkg}.conf").exists()
    host = subprocess.run(["dpkg", "-s", pkg], capture_output=True, text=True, check=False)
    assert host.returncode != 0, host.stdout


# --- issue 11: a package whose postinst adds a system group and user (``apt-get install cron``
# failed with ``groupadd: cannot lock /etc/group; try again later.``): the task has its own
# /etc/passwd, group, shadow (scrubbed) and gshadow (scrubbed), the host's never change.

USERS_SPEC = """
workflow:
  name: apt-users
  tasks:
  - name: t
    exitActions:
      {{action}}: 42
    environment:
      PKG: "{{pkg}}"
      NAME: "{{name}}"
    volumeMounts:
    - "{{repo}}:/srv/tinyrepo"
    command:
    - sh
    - -c
    - |
      set -e
      o="{{output}}"
      if [ "$TRAINYARD_RETRY_ID" = 0 ]; then
        echo "deb [trusted=yes] file:/srv/tinyrepo ./" > /etc/apt/sources.list.d/$PKG.list
        apt-get update -o Dir::Etc::SourceList=/etc/apt/sources.list.d/$PKG.list \\
          -o Dir::Etc::SourceParts=- -o APT::Get::List-Cleanup=0
        apt-get install -y --no-install-recommends "$PKG"
        dpkg -s "$PKG" | grep '^Status:' > "$o/r0-status"
        group_id=$(getent group "$NAME" | cut -d: -f3)
        echo "$(getent passwd "$NAME" | cut -d: -f1,4) $group_id" > "$o/r0-user"
        grep -c "^$NAME:" /etc/shadow /etc/gshadow > "$o/r0-shadow-lines"
        stat -c '%n %u:%g %a' /etc/passwd /etc/group /etc/shadow /etc/gshadow > "$o/r0-owners"
        cat /etc/shadow /etc/gshadow > "$o/r0-secrets"
        exit 42
      fi
      if getent passwd "$NAME" >/dev/null; then echo present; else echo absent; fi > "$o/r1-user"
"""

USERS_POSTINST = """#!/bin/sh
set -e
groupadd --system {name}
useradd --system -g {name} {name}
"""

ACCOUNT_FILES = (
    "/etc/passwd",
    "/etc/group",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/subuid",
    "/etc/subgid",
    "/etc/.pwd.lock",
)


def _accounts_state() -> dict[str, tuple[str, int, int]]:
    """(digest, mtime in ns, mode) of each of the host's account files that exists."""
    state = {}
    for name in ACCOUNT_FILES:
        path = Path(name)
        if path.exists():
            info = path.stat()
            state[name] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                info.st_mtime_ns,
                info.st_mode,
            )
    return state


def _password_fields(text: str) -> set[str]:
    """The password fields (second) of shadow or gshadow lines."""
    return {line.split(":")[1] for line in text.splitlines() if line.count(":") >= 1}


@pytest.mark.parametrize(
    ("action", "after"),
    [
        ("RESTART", "present"),  # the same root: the user added by the postinst is still there
        ("RESCHEDULE", "absent"),  # a fresh root: it is not
    ],
)
def test_a_postinst_that_adds_a_system_group_and_user_installs(
    run: EngineRun,
    repo: Path,
    action: str,
    after: str,
) -> None:
    pkg = f"trainyard-tiny-{uuid.uuid4().hex[:10]}"
    name = f"ty{uuid.uuid4().hex[:10]}"
    _build_repo(repo / pkg, pkg, postinst=USERS_POSTINST.format(name=name))
    before = _accounts_state()
    wid = run.run(USERS_SPEC, action=action, pkg=pkg, name=name, repo=str(repo / pkg))
    log = run.log(wid, "t") + run.log(wid, "t", 1)
    assert run.engine.state(wid).status is WorkflowStatus.COMPLETED, log
    first = run.engine.run_dir(wid, "t", 1 if action == "RESTART" else 0) / "output"
    assert (first / "r0-status").read_text() == "Status: install ok installed\n", log
    user, group_id = (first / "r0-user").read_text().split()
    assert user == f"{name}:{group_id}", log  # the user's primary group is the new group
    assert (first / "r0-shadow-lines").read_text() == "/etc/shadow:1\n/etc/gshadow:1\n", log
    owners = (first / "r0-owners").read_text().splitlines()  # the task's root's, host modes
    assert owners == [
        f"/etc/{n} 0:0 {oct(os.stat(f'/etc/{n}').st_mode & 0o777)[2:]}"
        for n in ("passwd", "group", "shadow", "gshadow")
    ], log
    secrets = (first / "r0-secrets").read_text()
    assert "$" not in secrets  # no hash of the host's, ever
    assert _password_fields(secrets) <= {"*", "!"}, secrets
    last = run.engine.run_dir(wid, "t", 1) / "output"
    assert (last / "r1-user").read_text() == f"{after}\n", log
    assert _accounts_state() == before  # the host's bytes and mtimes: unchanged
    host = subprocess.run(["getent", "passwd", name], capture_output=True, check=False)
    assert host.returncode != 0, host.stdout


ALICE_SPEC = """
workflow:
  name: add-users
  tasks:
  - name: t
    command:
    - sh
    - -c
    - |
      set -e
      o="{{output}}"
      cat /etc/shadow > "$o/shadow-before"
      cat /etc/shadow- /etc/gshadow- 2>/dev/null | cut -d: -f2 | sort -u > "$o/backup-fields"
      useradd -m -s /bin/sh {{name}}
      id {{name}} > "$o/id"
      stat -c '%F' /home/{{name}} > "$o/home"
      adduser --system --group --no-create-home {{name}}svc > "$o/adduser.log" 2>&1
      getent group {{name}}svc | cut -d: -f1 > "$o/group"
      cut -d: -f2 /etc/shadow | sort -u > "$o/fields"
      grep -c '\\$' /etc/shadow /etc/gshadow > "$o/hashes" || true
      for f in shadow gshadow passwd group; do cp /etc/$f "$o/etc-$f"; done
      stat -c '%u:%g' /home/{{name}} > "$o/home-owner"
      su {{name}} -c id > "$o/su" 2>&1 || echo "exit $?" >> "$o/su"
"""


@pytest.mark.parametrize("layer", ["fresh layer", "per task"])
def test_a_task_adds_users_in_its_own_root_and_never_sees_a_host_hash(
    run: EngineRun,
    layer: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if layer == "per task":  # no skeleton base: the runner writes them (make_fresh)
        from trainyard.backends.local import isolation

        monkeypatch.setattr(isolation, "skeleton_base", lambda: None)
    name = f"al{uuid.uuid4().hex[:8]}"
    before = _accounts_state()
    sandbox.account_entries.cache_clear()  # the backend reads the host's once per process
    layers._fresh_entries.cache_clear()
    wid = run.run(ALICE_SPEC, name=name)
    log = run.log(wid, "t")
    assert run.engine.state(wid).status is WorkflowStatus.COMPLETED, log
    out = run.engine.run_dir(wid, "t", 0) / "output"
    runner = json.loads((out.parent / "run.json").read_text())["sandbox"]["userns"]
    made_per_task = {f["relative"] for f in runner["fresh"]}
    assert ("shadow" in made_per_task) is (layer == "per task"), made_per_task
    assert (out / "id").read_text().startswith("uid="), log
    assert f"({name})" in (out / "id").read_text(), log
    assert (out / "home").read_text() == "directory\n", log
    assert (out / "group").read_text() == f"{name}svc\n", log
    assert (out / "hashes").read_text() == "/etc/shadow:0\n/etc/gshadow:0\n", log
    host_shadow = Path("/etc/shadow").read_text()  # the host's, scrubbed, as the task saw it
    assert (out / "shadow-before").read_text() == sandbox.scrub_passwords(host_shadow)
    backups = set((out / "backup-fields").read_text().split())  # /etc/shadow-, gshadow-
    assert backups <= {"*", "!"} and (bool(backups) or not Path("/etc/shadow-").exists())
    assert set((out / "fields").read_text().split()) <= {"*", "!"}, log
    for copied in ("shadow", "gshadow"):
        assert "$" not in (out / f"etc-{copied}").read_text()
    host_passwd = Path("/etc/passwd").read_text()
    assert (out / "etc-passwd").read_text().startswith(host_passwd)  # the host's, then its own
    assert f"\n{name}:" in (out / "etc-passwd").read_text()
    # a task has one uid (its root): the home cannot be given to alice, nor can su switch to
    # her (no CAP_CHOWN, CAP_SETUID, CAP_SETGID: docs/security.md says why)
    assert (out / "home-owner").read_text() == "0:0\n", log
    assert (out / "su").read_text().endswith("exit 1\n"), (out / "su").read_text()
    assert _accounts_state() == before
    assert f"{name}:" not in Path("/etc/passwd").read_text()
