"""The live backend against kmock's Kubernetes API emulator (real HTTP, the official client
through a kubeconfig file): objects made with owners, facts from the watch as the test plays
the kubelet, stops, the gang timeout, recovery by a new backend object, and nothing left
behind once the workflow is forgotten."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_emulator import NAMESPACE, Emulator, Kubelet
from k8s_support import GiB, launches, pool

from trainyard.backends.base import FactKind, TaskFact, TaskKey, TaskResources
from trainyard.backends.kubernetes import KubernetesBackend

RES = TaskResources(cpu=1, memory_bytes=GiB)
WID = "train-1"


def _backend(emulator: Emulator, home: Path, **options: Any) -> KubernetesBackend:
    settings = {
        "namespace": NAMESPACE,
        "kubeconfig": str(emulator.kubeconfig),
        "lost_grace_s": 0.2,
        "server_url": "http://trainyard.trainyard.svc:8000",
        **options,
    }
    return KubernetesBackend(pool(settings), home)


@pytest.fixture
def backend(emulator: Emulator, tmp_path: Path) -> Iterator[KubernetesBackend]:
    made = _backend(emulator, tmp_path)
    yield made
    made.close()


def _gang(**fields: Any) -> list[Any]:
    return launches({"master": RES, "worker": RES}, workflow_id=WID, **fields)


def _facts_until(
    backend: KubernetesBackend, done: Callable[[list[TaskFact]], bool], timeout_s: float = 10
) -> list[TaskFact]:
    """Poll until ``done(all facts so far)``; fails with what came after ``timeout_s``."""
    facts: list[TaskFact] = []
    deadline = time.monotonic() + timeout_s
    while not done(facts):
        assert time.monotonic() < deadline, f"facts so far: {facts}"
        facts += backend.poll()
        time.sleep(0.02)
    return facts


def _ending(facts: list[TaskFact], task: str) -> TaskFact | None:
    return next(
        (
            f
            for f in facts
            if f.key.task == task
            and f.kind in (FactKind.EXITED, FactKind.LOST, FactKind.START_ERROR)
        ),
        None,
    )


def _pod(task: str, retry: int = 0) -> str:
    return f"ty-{WID}-{task}-{retry}"


def test_start_makes_owned_objects_and_the_run_secret_carries_the_token(
    backend: KubernetesBackend, emulator: Emulator
) -> None:
    backend.start_group(_gang())
    owner = next(c for c in emulator.objects("configmaps") if c["metadata"]["name"] == f"ty-{WID}")
    uid = owner["metadata"]["uid"]
    made = [o for kind in ("pods", "services", "secrets") for o in emulator.objects(kind)]
    assert sorted(o["metadata"]["name"] for o in made) == sorted(
        [_pod("master"), _pod("worker")] * 2 + [f"ty-{WID}-training"]
    )
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == uid for o in made)
    secret = next(s for s in emulator.objects("secrets") if s["metadata"]["name"] == _pod("master"))
    run = json.loads(secret["stringData"]["run.json"])
    assert run["sandbox"]["env"]["TRAINYARD_SERVER_URL"] == "http://trainyard.trainyard.svc:8000"
    assert run["sandbox"]["env"]["TRAINYARD_TOKEN"].startswith("ty")


def test_pod_lifecycle_becomes_facts(backend: KubernetesBackend, emulator: Emulator) -> None:
    kubelet = Kubelet(emulator)
    backend.start_group(_gang())
    time.sleep(0.2)
    assert backend.poll() == []  # Pending: nothing to say
    kubelet.run(_pod("master"))
    kubelet.run(_pod("worker"))
    facts = _facts_until(backend, lambda f: len(f) >= 4)
    assert sorted((f.key.task, f.kind) for f in facts) == [
        ("master", FactKind.INITIALIZING),
        ("master", FactKind.RUNNING),
        ("worker", FactKind.INITIALIZING),
        ("worker", FactKind.RUNNING),
    ]
    emulator.set_log(_pod("master"), "2026/11/26 00:00:00 [master] hello\n")
    kubelet.exit(_pod("master"), 0)
    kubelet.exit(_pod("worker"), 2010, "input 0: no such dataset")
    facts = _facts_until(backend, lambda f: len(f) >= 2)
    log = backend.home / "runs" / WID / "master" / "0" / "task.log"
    assert log.read_text() == "2026/11/26 00:00:00 [master] hello\n"  # workflow logs reads it
    assert _ending(facts, "master") == TaskFact(
        TaskKey(WID, "master", 0), FactKind.EXITED, _ending(facts, "master").time_s, 0, ""
    )
    worker = _ending(facts, "worker")
    assert (worker.kind, worker.exit_code, worker.message) == (
        FactKind.EXITED,
        2010,
        "input 0: no such dataset",
    )
    time.sleep(0.1)
    assert backend.poll() == []  # each fact once


def test_image_pull_error_eviction_and_oom(backend: KubernetesBackend, emulator: Emulator) -> None:
    kubelet = Kubelet(emulator)
    backend.start_group(launches({"a": RES, "b": RES, "c": RES}, workflow_id=WID))
    kubelet.image_pull_error(_pod("a"))
    kubelet.run(_pod("b"))
    kubelet.evict(_pod("b"), ran=False)
    kubelet.run(_pod("c"))
    kubelet.exit(_pod("c"), 137, report=False, reason="OOMKilled")
    facts = _facts_until(backend, lambda f: all(_ending(f, t) for t in "abc"))
    assert _ending(facts, "a").kind is FactKind.START_ERROR
    assert "ImagePullBackOff" in _ending(facts, "a").message
    assert (_ending(facts, "b").kind, _ending(facts, "b").exit_code) == (FactKind.EXITED, 3004)
    assert (_ending(facts, "c").exit_code, "OOMKilled" in _ending(facts, "c").message) == (
        137,
        True,
    )


def test_pod_deleted_by_someone_is_lost(backend: KubernetesBackend, emulator: Emulator) -> None:
    backend.start_group(_gang())
    Kubelet(emulator).run(_pod("master"))
    emulator.core.delete_namespaced_pod(_pod("master"), NAMESPACE)
    facts = _facts_until(backend, lambda f: _ending(f, "master") is not None)
    assert _ending(facts, "master").kind is FactKind.LOST
    assert "gone" in _ending(facts, "master").message


def test_stop_deletes_the_pod_and_reports_a_stopped_exit(
    backend: KubernetesBackend, emulator: Emulator
) -> None:
    backend.start_group(_gang())
    Kubelet(emulator).run(_pod("master"))
    backend.stop([TaskKey(WID, "master", 0)])
    backend.stop([TaskKey(WID, "master", 0)])  # idempotent
    facts = _facts_until(backend, lambda f: _ending(f, "master") is not None)
    assert (_ending(facts, "master").kind, _ending(facts, "master").exit_code) == (
        FactKind.EXITED,
        143,
    )
    assert emulator.pod(_pod("master")) is None and emulator.pod(_pod("worker")) is not None


def test_gang_not_all_running_in_time_is_deleted_whole(emulator: Emulator, tmp_path: Path) -> None:
    backend = _backend(emulator, tmp_path, scheduler="none", gang_timeout_s=0.5)
    try:
        backend.start_group(_gang())
        Kubelet(emulator).run(_pod("master"))  # the worker never gets a node
        facts = _facts_until(backend, lambda f: all(_ending(f, t) for t in ("master", "worker")))
        assert {
            (_ending(facts, t).kind, _ending(facts, t).exit_code) for t in ("master", "worker")
        } == {(FactKind.EXITED, 3005)}  # START_TIMEOUT
        assert "gang_timeout_s" in _ending(facts, "worker").message
        assert emulator.pods_of(WID) == []
    finally:
        backend.close()


def test_unschedulable_is_the_waiting_reason(
    backend: KubernetesBackend, emulator: Emulator
) -> None:
    backend.start_group(_gang())
    Kubelet(emulator).unschedulable(_pod("master"), "0/4 nodes: 4 Insufficient nvidia.com/gpu")
    deadline = time.monotonic() + 10
    while "Insufficient" not in backend.waiting_reason(TaskKey(WID, "master", 0)):
        assert time.monotonic() < deadline
        assert backend.poll() == []
        time.sleep(0.02)


def test_a_new_backend_recovers_running_attempts_and_starts_nothing_twice(
    emulator: Emulator, tmp_path: Path
) -> None:
    first = _backend(emulator, tmp_path)
    first.start_group(_gang())
    Kubelet(emulator).run(_pod("master"))
    Kubelet(emulator).exit(_pod("worker"), 0)
    first.close()
    second = _backend(emulator, tmp_path)
    try:
        keys = [TaskKey(WID, "master", 0), TaskKey(WID, "worker", 0), TaskKey(WID, "extra", 0)]
        assert second.unstarted(keys) == [TaskKey(WID, "extra", 0)]
        assert second.recover(keys[:2]) == [TaskKey(WID, "master", 0)]
        second.start_group(_gang())  # a start made again after a crash: both pods adopted
        assert len(emulator.pods_of(WID)) == 2
        Kubelet(emulator).exit(_pod("master"), 0)
        facts = _facts_until(second, lambda f: _ending(f, "master") and _ending(f, "worker"))
        assert [_ending(facts, t).exit_code for t in ("master", "worker")] == [0, 0]
    finally:
        second.close()


def test_forget_deletes_the_owner_and_the_collector_the_rest(
    backend: KubernetesBackend, emulator: Emulator
) -> None:
    backend.start_group(_gang())
    assert len(emulator.left_of(WID)) == 6
    backend.forget(WID)
    emulator.collect_garbage()
    assert emulator.left_of(WID) == []


def test_dry_run_needs_no_cluster(tmp_path: Path) -> None:
    backend = KubernetesBackend(pool({"kubeconfig": str(tmp_path / "none")}), tmp_path)
    assert "kind: Pod" in backend.dry_run(_gang())
    backend.close()


def test_entry_names_the_running_pod_for_kubectl_exec(
    backend: KubernetesBackend, emulator: Emulator
) -> None:
    from trainyard.cli.task_entry import command_argv as _command_argv
    from trainyard.errors import RefusedError

    backend.start_group(_gang())
    key = TaskKey(WID, "master", 0)
    with pytest.raises(RefusedError, match="no running pod"):
        backend.entry(key)  # Pending
    Kubelet(emulator).run(_pod("master"))
    _facts_until(backend, lambda f: any(x.kind is FactKind.RUNNING for x in f))
    entry = backend.entry(key)
    assert _command_argv(entry, ["nvidia-smi"], tty=False) == [
        "kubectl",
        "--kubeconfig",
        str(emulator.kubeconfig),
        "-n",
        NAMESPACE,
        "exec",
        "-i",
        _pod("master"),
        "-c",
        "task",
        "--",
        "nvidia-smi",
    ]
    assert entry["python"] == "/opt/trainyard/venv/bin/python"  # port-forward's relay runs it


def test_an_unreachable_api_loses_no_attempt(emulator: Emulator, tmp_path: Path) -> None:
    first = _backend(emulator, tmp_path)
    first.start_group(_gang())
    Kubelet(emulator).run(_pod("master"))
    first.close()
    emulator.close()  # the API server goes away (the engine restarts meanwhile)
    second = _backend(emulator, tmp_path)
    try:
        keys = [TaskKey(WID, "master", 0), TaskKey(WID, "worker", 0)]
        assert second.recover(keys) == keys  # adopted: nothing can be known now
        deadline = time.monotonic() + 3  # 15 times lost_grace_s
        while time.monotonic() < deadline:
            assert second.poll() == []  # no pod seen is no pod gone
            time.sleep(0.05)
    finally:
        second.close()


def test_no_cluster_configured_fails_the_start_as_a_backend_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard.errors import BackendError

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not inside a pod either
    backend = KubernetesBackend(pool({"kubeconfig": str(tmp_path / "missing")}), tmp_path)
    with pytest.raises(BackendError, match="no cluster configured"):
        backend.start_group(_gang())
    backend.close()


def test_a_refused_object_is_a_backend_error_naming_it(
    backend: KubernetesBackend, emulator: Emulator
) -> None:
    from trainyard.backends.kubernetes.client import AlreadyExists
    from trainyard.errors import BackendError

    api = backend._cluster()
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": NAMESPACE},
    }
    api.create(config_map)
    with pytest.raises(AlreadyExists, match="create ConfigMap x"):
        api.create(config_map)
    with pytest.raises(BackendError, match="read ConfigMap nope: 404"):
        api.read_config_map("nope")


def _until(
    check: Callable[[], bool], backend: KubernetesBackend, timeout_s: float = 10
) -> list[TaskFact]:
    """Poll the backend until ``check()``; returns the facts seen meanwhile."""
    facts: list[TaskFact] = []
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"facts so far: {facts}"
        facts += backend.poll()
        time.sleep(0.02)
    return facts


def test_a_running_pods_log_reaches_the_run_folder_as_it_is_written(
    backend: KubernetesBackend, emulator: Emulator
) -> None:
    """Issue 26: ``workflow logs -f`` and the dashboard follow the attempt's ``task.log``
    here; on Kubernetes the backend follows the pod's log through the API while it runs."""
    feed = emulator.feed_log(_pod("master"))
    backend.start_group(_gang())
    kubelet = Kubelet(emulator)
    kubelet.run(_pod("master"))
    log = backend.home / "runs" / WID / "master" / "0" / "task.log"
    first, second = "2026/11/26 00:00:00 [master] step 1\n", "2026/11/26 00:00:05 [master] step 2\n"
    feed.write(first)
    facts = _until(lambda: log.exists() and log.read_text() == first, backend)
    assert _ending(facts, "master") is None  # still running: the line came live
    feed.write(second)
    _until(lambda: log.read_text() == first + second, backend)
    kubelet.exit(_pod("master"), 0)  # the container ends: so does its followed log
    _facts_until(backend, lambda f: _ending(f, "master") is not None)
    assert log.read_text() == first + second  # each line once, the end read nothing twice


def test_a_followed_log_is_bounded(
    backend: KubernetesBackend, emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard.backends.kubernetes import logs

    monkeypatch.setattr(logs, "LOG_LIMIT_BYTES", 40)
    feed = emulator.feed_log(_pod("master"))
    backend.start_group(_gang())
    Kubelet(emulator).run(_pod("master"))
    log = backend.home / "runs" / WID / "master" / "0" / "task.log"
    feed.write("x" * 30 + "\n")
    feed.write("y" * 30 + "\n")
    _until(lambda: log.exists() and log.stat().st_size == 40, backend)
    feed.write("z" * 30 + "\n")
    Kubelet(emulator).exit(_pod("master"), 0)
    _facts_until(backend, lambda f: _ending(f, "master") is not None)
    assert log.read_bytes() == b"x" * 30 + b"\n" + b"y" * 9
