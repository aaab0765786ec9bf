"""``workflow rsync`` into a Kubernetes task: real rsync, with ``rsync_rsh`` as its remote
shell, which runs ``kubectl exec -i POD -c CONTAINER -- rsync --server ...`` (the same host
command as ``workflow exec``). No cluster here: ``kubectl`` on PATH is a shim that checks the
arguments it is given (namespace, kubeconfig, context, pod, container, no TTY: a TTY would
corrupt rsync's byte stream) and runs the command after ``--`` on this machine, as the pod's
container would. A second upload after a one-byte change must move a delta.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest
from rsync_stats import later_mtime, literal_bytes

from trainyard.cli.rsync_copy import copy_once, local_rsync, parse_rsync_args
from trainyard.server.answers import TaskEntryAnswer

pytestmark = pytest.mark.skipif(
    shutil.which("rsync") is None or local_rsync() is None,
    reason="rsync >= 3.4.0 is not installed here",
)

SIZE = 4 * 1024 * 1024

SHIM = """#!/bin/sh
# kubectl shim: record the call, check its shape, run what follows '--' here.
echo "$@" >> "$KUBECTL_SHIM_LOG"
expect="--kubeconfig /etc/kube.yaml --context lab -n ml exec -i wf-1-t-0 -c task --"
case "$*" in
  "$expect "*) ;;
  *) echo "kubectl shim: unexpected arguments: $*" >&2; exit 99 ;;
esac
shift 12
exec "$@"
"""


@pytest.fixture
def kubernetes_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TaskEntryAnswer:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "kubectl"
    shim.write_text(SHIM)
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KUBECTL_SHIM_LOG", str(tmp_path / "kubectl.log"))
    return {
        "workflow_id": "wf-1",
        "task": "t",
        "retry_id": 0,
        "status": "RUNNING",
        "backend": "kubernetes",
        "namespace": "ml",
        "pod": "wf-1-t-0",
        "container": "task",
        "kubeconfig": "/etc/kube.yaml",
        "context": "lab",
    }


def _upload(entry: TaskEntryAnswer, src: Path, dst: Path) -> str:
    said: list[str] = []
    copy_once(parse_rsync_args(["wf-1", "t", f"{src}:{dst}"]), entry, report=said.append)
    return "\n".join(said)


def test_an_upload_goes_through_kubectl_exec_and_a_second_one_moves_a_delta(
    kubernetes_entry: TaskEntryAnswer, tmp_path: Path
) -> None:
    src = tmp_path / "code"
    src.mkdir()
    data = bytearray(os.urandom(SIZE))
    (src / "weights.bin").write_bytes(data)
    pod_side = tmp_path / "pod-workspace"
    first = _upload(kubernetes_entry, src, pod_side)
    assert literal_bytes(first) >= SIZE
    data[SIZE // 3] ^= 0xFF
    (src / "weights.bin").write_bytes(data)
    later_mtime(src / "weights.bin")  # rsync's quick check: same size and second = unchanged
    second = _upload(kubernetes_entry, src, pod_side)
    assert literal_bytes(second) < SIZE // 50  # a block or two, not 4 MiB
    copied = (pod_side / "code" / "weights.bin").read_bytes()
    assert hashlib.sha256(copied).hexdigest() == hashlib.sha256(data).hexdigest()
    calls = (tmp_path / "kubectl.log").read_text().splitlines()
    assert any(" -- rsync --server" in call for call in calls), calls
    assert not any(" -t " in call for call in calls), calls


def test_a_pod_without_rsync_gets_the_tar_copy_through_the_same_kubectl(
    kubernetes_entry: TaskEntryAnswer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_RSYNC_PATH", "/nonexistent/rsync")
    src = tmp_path / "small"
    src.mkdir()
    (src / "a.txt").write_text("by tar through kubectl\n")
    said = _upload(kubernetes_entry, src, tmp_path / "pod-workspace")
    assert "through tar" in said
    assert (
        tmp_path / "pod-workspace" / "small" / "a.txt"
    ).read_text() == "by tar through kubectl\n"
    calls = (tmp_path / "kubectl.log").read_text().splitlines()
    assert any("tar -x" in call for call in calls), calls
    assert not any("rsync --server" in call for call in calls), calls
