"""A task runs without privileges (issue 11, "Tasks run as root with nearly all
capabilities: ``mount -o remount,bind,rw /opt && touch /opt/x`` writes to the host"): root in
a user namespace of its own, no capability, no further user namespace; ``mount``,
``unshare``, ``setns``/``nsenter`` and raw sockets fail, the host's read-only folders stay
unwritten, sysctls and ``/sys`` are read-only, ``/dev`` holds no disk and ``/run`` no host
socket, the GPUs' device nodes are still there, and no host process is visible (a PID
namespace of its own).

Through the real local backend (launcher, hosted runner) and its bubblewrap sandbox.
"""

from __future__ import annotations

import glob
import os
import uuid
from pathlib import Path

from local_support import final, group_launches, task_log, wait_final

from trainyard.backends.local import LocalBackend

PROBE = r"""
r="$1/report"; mark="$2"
: > "$r"
ls -A /run | sed 's/^/SEES \/run\//' >> "$r"  # before mount(8) leaves its utab there
try() { name=$1; shift; if "$@" >/dev/null 2>&1; then echo "ALLOWED $name" >> "$r"; fi; }
try remount-opt sh -c "mount -o remount,bind,rw /opt && touch /opt/$mark"
try remount-usr sh -c "mount -o remount,rw /usr/lib && touch /usr/lib/$mark"
try mount-tmpfs mount -t tmpfs none /mnt
try unshare-user unshare -U true
try unshare-mount unshare -m true
try unshare-net unshare -n true
try nsenter-init nsenter -t 1 -m -n true
try raw-socket python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)"
try chown-other sh -c "touch /tmp/c && chown 1000 /tmp/c"
# a sysctl written with its own value: harmless if the test fails
try sysctl sh -c 'v=$(cat /proc/sys/kernel/core_pattern) && printf "%s\n" "$v" > /proc/sys/kernel/core_pattern'
try sysfs sh -c 'v=$(cat /sys/kernel/mm/transparent_hugepage/defrag | sed "s/.*\[\(.*\)\].*/\1/") && echo "$v" > /sys/kernel/mm/transparent_hugepage/defrag'
ls /dev | grep -E '^(sd|vd|xvd|hd|nvme|loop|dm-|md|mem$|kmem$|port$|kmsg$)' | sed 's/^/SEES device /' >> "$r"
grep -q '^CapEff:[[:space:]]*0000000000000000$' /proc/self/status || echo "ALLOWED capabilities" >> "$r"
for dev in $3; do test -r "$dev" || echo "MISSING $dev" >> "$r"; done
kill -0 "$4" 2>/dev/null && echo "SEES host process $4" >> "$r"
test "$(ls /proc | grep -c '^[0-9]')" -le 5 || echo "SEES $(ls /proc | grep -c '^[0-9]') processes" >> "$r"
echo done >> "$r"
"""


def test_a_task_has_no_privileges_over_the_host(sandboxed: LocalBackend, home: Path) -> None:
    mark = f"trainyard-priv-{uuid.uuid4().hex}"
    gpus = " ".join(sorted(glob.glob("/dev/nvidia*")))
    launches = group_launches(
        sandboxed,
        home,
        "wf-priv",
        {
            "t": {
                "command": ["sh", "/tmp/probe.sh", "{{output}}", mark, gpus, str(os.getpid())],
                "files": [{"path": "/tmp/probe.sh", "contents": PROBE}],
            }
        },
    )
    host_places = [Path("/opt") / mark, Path("/usr/lib") / mark]
    try:
        sandboxed.start_group(launches)
        facts = wait_final(sandboxed, [launches[0].key])
        assert final(facts[launches[0].key]).exit_code == 0, task_log(launches[0])
        report = (launches[0].run_dir / "output" / "report").read_text().splitlines()
        assert report == ["done"], report
        assert [p for p in host_places if p.exists()] == []
    finally:
        for path in host_places:  # what a sandbox that failed this test wrote
            path.unlink(missing_ok=True)
