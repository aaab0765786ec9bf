"""Whole workflows through the engine on a Kubernetes pool, against kmock's API emulator:
the seed two-node torchrun spec, a DAG, RESCHEDULE after an eviction, cancel, and an engine
restart that starts nothing twice. The test plays the kubelet: it waits for the pods the
engine made and moves them along; the engine sees only what the watch reports."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_emulator import NAMESPACE, Emulator, Kubelet
from k8s_support import pool
from kubernetes.client.exceptions import ApiException

from trainyard import spec
from trainyard.engine.reconciler import Engine, Submission
from trainyard.store import Store

REPO = Path(__file__).resolve().parents[4]
SEED = (REPO / "examples" / "torchrun_multinode" / "train.yaml").read_text()
DAG = """workflow:
  name: dag
  groups:
  - name: prep
    tasks:
    - name: fetch
      image: busybox
      command: [sh, -c, "echo data > {{output}}/x"]
  - name: train
    tasks:
    - name: train
      image: busybox
      command: [sh, -c, "cat {{input:0}}/x"]
      inputs: [{task: fetch}]
"""
RESCHEDULE = """workflow:
  name: evicted
  tasks:
  - name: trainer
    image: busybox
    command: [sleep, "100"]
    exitActions:
      RESCHEDULE: [143]  # stopped (the kubelet's SIGTERM of an eviction)
"""
TIMEOUT_S = 30


class EngineOnK8s:
    """The engine on a Kubernetes pool pointed at the emulator, stepped by a thread."""

    def __init__(
        self,
        home: Path,
        emulator: Emulator,
        *,
        options: dict[str, Any] | None = None,
        **pool_fields: Any,
    ) -> None:
        self.home = home
        home.mkdir(exist_ok=True)
        self.pool = pool(
            {
                "namespace": NAMESPACE,
                "kubeconfig": str(emulator.kubeconfig),
                "lost_grace_s": 0.2,
                "runs_claim": "trainyard-runs",
                **(options or {}),
            },
            **pool_fields,
        )
        self.engine = Engine(
            Store(f"sqlite:///{home / 'db.sqlite'}"), home, pools={self.pool.name: self.pool}
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self.engine.run_forever, args=(self._stop,), daemon=True
        )
        self._thread.start()

    def submit(self, text: str) -> str:
        doc = spec.load(text, pool=self.pool)
        return self.engine.submit(
            Submission(spec=doc.workflow, spec_text=text, user="tester", pool=self.pool)
        ).id

    def status(self, wid: str) -> str:
        return str(self.engine.wait(wid, TIMEOUT_S).status)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.close()


@pytest.fixture
def run(emulator: Emulator, tmp_path: Path) -> Iterator[EngineOnK8s]:
    made = EngineOnK8s(tmp_path / "home", emulator)
    yield made
    made.close()


def _pods(emulator: Emulator, wid: str, count: int) -> list[dict[str, Any]]:
    """The workflow's pods once there are ``count`` (by name); fails after TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while len(pods := emulator.pods_of(wid)) < count:
        assert time.monotonic() < deadline, f"pods: {[p['metadata']['name'] for p in pods]}"
        time.sleep(0.05)
    return sorted(pods, key=lambda p: p["metadata"]["name"])


def _finish(emulator: Emulator, names: list[str], code: int = 0) -> None:
    """Run every pod of ``names``, then end each with ``code``; a pod the engine deleted in
    between (the first end of a gang stops its others) has nothing left to end."""
    kubelet = Kubelet(emulator)
    for name in names:
        kubelet.run(name)
    for name in names:
        try:
            kubelet.exit(name, code)
        except ApiException as exc:
            if exc.status != 404:
                raise


def test_seed_two_node_spec_completes(run: EngineOnK8s, emulator: Emulator) -> None:
    wid = run.submit(SEED)
    pods = _pods(emulator, wid, 2)
    names = [p["metadata"]["name"] for p in pods]
    assert names == [f"ty-{wid}-master-0", f"ty-{wid}-worker-0"]
    secret = next(s for s in emulator.objects("secrets") if s["metadata"]["name"] == names[1])
    hosts = json.loads(secret["stringData"]["run.json"])["hosts"]
    assert hosts["master"] == f"master.ty-{wid}-training.{NAMESPACE}.svc.cluster.local"
    assert {p["spec"]["subdomain"] for p in pods} == {f"ty-{wid}-training"}
    _finish(emulator, names)
    assert run.status(wid) == "COMPLETED"
    # no pod but these two was ever made (the lead's end may stop the worker: OSMO's rule)
    assert {p["metadata"]["name"] for p in emulator.pods_of(wid)} <= set(names)
    _delete_leaves_nothing(run, emulator, wid)


def test_dag_starts_the_downstream_group_after_its_input(
    run: EngineOnK8s, emulator: Emulator
) -> None:
    wid = run.submit(DAG)
    [fetch] = _pods(emulator, wid, 1)
    time.sleep(0.5)
    assert len(emulator.pods_of(wid)) == 1  # train waits for fetch
    _finish(emulator, [fetch["metadata"]["name"]])
    pods = _pods(emulator, wid, 2)
    assert pods[1]["metadata"]["name"] == f"ty-{wid}-train-0"
    _finish(emulator, [f"ty-{wid}-train-0"])
    assert run.status(wid) == "COMPLETED"
    _delete_leaves_nothing(run, emulator, wid)


def test_eviction_reschedules_the_task(run: EngineOnK8s, emulator: Emulator) -> None:
    wid = run.submit(RESCHEDULE)
    _pods(emulator, wid, 1)
    kubelet = Kubelet(emulator)
    kubelet.run(f"ty-{wid}-trainer-0")
    kubelet.evict(f"ty-{wid}-trainer-0")
    pods = _pods(emulator, wid, 2)
    assert pods[1]["metadata"]["name"] == f"ty-{wid}-trainer-1"
    _finish(emulator, [f"ty-{wid}-trainer-1"])
    assert run.status(wid) == "COMPLETED"
    state = run.engine.state(wid)
    assert state.tasks["trainer"].retry_id == 1


def test_cancel_deletes_the_pods(run: EngineOnK8s, emulator: Emulator) -> None:
    wid = run.submit(SEED)
    pods = _pods(emulator, wid, 2)
    Kubelet(emulator).run(pods[0]["metadata"]["name"])
    run.engine.cancel(wid)
    assert run.status(wid) == "FAILED_CANCELED"
    assert emulator.pods_of(wid) == []
    _delete_leaves_nothing(run, emulator, wid)


def _delete_leaves_nothing(run: EngineOnK8s, emulator: Emulator, wid: str) -> None:
    """``workflow delete``: the backend deletes the owner ConfigMap; once the (test's)
    garbage collector ran, no object labelled with the workflow is left."""
    assert emulator.left_of(wid)
    run.engine.delete([wid])
    emulator.collect_garbage()
    assert emulator.left_of(wid) == []


def test_engine_restart_recovers_and_starts_nothing_twice(
    emulator: Emulator, tmp_path: Path
) -> None:
    first = EngineOnK8s(tmp_path / "home", emulator)
    wid = first.submit(SEED)
    names = [p["metadata"]["name"] for p in _pods(emulator, wid, 2)]
    Kubelet(emulator).run(names[0])
    first.close()
    second = EngineOnK8s(tmp_path / "home", emulator)
    try:
        time.sleep(0.5)
        _finish(emulator, names)
        assert second.status(wid) == "COMPLETED"
        assert {p["metadata"]["name"] for p in emulator.pods_of(wid)} <= set(names)
        created = [r for r in emulator.requests_to_create_pods() if wid in r]
        assert sorted(created) == names  # each pod created once, by the first engine
    finally:
        second.close()


def _waiting(run: EngineOnK8s, wid: str, done: Any) -> list[dict[str, Any]]:
    """The workflow's waits as the server answers them (``reasons_json``: query, --wait,
    ``-t json`` and the dashboard) once ``done(waits)``; fails after TIMEOUT_S."""
    from trainyard.server.shapes import reasons_json

    deadline = time.monotonic() + TIMEOUT_S
    while not done(waits := reasons_json(run.engine.state(wid))["waiting"]):
        assert time.monotonic() < deadline, f"waiting: {waits}"
        time.sleep(0.05)
    return waits


def test_an_unschedulable_pod_is_the_groups_waiting_reason(
    run: EngineOnK8s, emulator: Emulator
) -> None:
    wid = run.submit(SEED)
    names = [p["metadata"]["name"] for p in _pods(emulator, wid, 2)]
    why = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    Kubelet(emulator).unschedulable(names[1], why)
    [wait] = _waiting(run, wid, lambda w: bool(w))
    assert wait["group"] == "training" and wait["status"] == "INITIALIZING"
    assert wait["reason"] == f"task worker: Unschedulable: {why}"
    assert wait["since"]  # queued since (ISO time)
    kubelet = Kubelet(emulator)
    for name in names:
        kubelet.run(name)
    _waiting(run, wid, lambda w: w == [])  # placed and running: nothing to wait for
    for name in reversed(names):  # the lead (master) last: its end deletes the worker's pod
        kubelet.exit(name, 0)
    assert run.status(wid) == "COMPLETED"


def test_a_gang_past_its_timeout_is_deleted_and_retried_by_the_pools_exit_action(
    emulator: Emulator, tmp_path: Path
) -> None:
    """Issue 26: ``scheduler: none``, one pod of the gang never runs; after
    ``gang_timeout_s`` both pods are deleted (3005) and the pool's ``default_exit_actions``
    (``RESCHEDULE: 3001,3005``, OSMO's rule) starts the whole gang again: it completes."""
    run = EngineOnK8s(
        tmp_path / "home",
        emulator,
        options={"scheduler": "none", "gang_timeout_s": 3},
        default_exit_actions={"RESCHEDULE": "3001,3005"},
        max_retries=1,
    )
    try:
        wid = run.submit(SEED)
        first = [p["metadata"]["name"] for p in _pods(emulator, wid, 2)]
        kubelet = Kubelet(emulator)
        kubelet.run(first[0])  # the worker never gets a node
        running: set[str] = set()
        deadline = time.monotonic() + TIMEOUT_S
        while True:  # each pod of the new start runs as soon as it is there
            assert time.monotonic() < deadline, [
                p["metadata"]["name"] for p in emulator.pods_of(wid)
            ]
            tasks = run.engine.state(wid).tasks
            current = {f"ty-{wid}-{t}-{tasks[t].retry_id}" for t in ("master", "worker")}
            if all(tasks[t].retry_id > 0 for t in ("master", "worker")) and current <= running:
                break
            for name in current - running:
                if emulator.pod(name) is not None and name not in first:
                    kubelet.run(name)
                    running.add(name)
            time.sleep(0.02)
        for name in sorted(current, reverse=True):  # the lead (master) last: its end stops
            kubelet.exit(name, 0)  # (deletes) the worker's pod, which then cannot end
        assert run.status(wid) == "COMPLETED"
        history = run.engine.state(wid).tasks["worker"].history
        assert [(a.status.value, a.exit_code) for a in history] == [("RESCHEDULED", 3005)]
    finally:
        run.close()


def test_the_submitters_registry_credential_becomes_the_pods_pull_secret(
    run: EngineOnK8s, emulator: Emulator
) -> None:
    """Issue 26: ``trainyard credential set ngc --type REGISTRY`` -> a dockerconfigjson Secret
    in the namespace, owned by the workflow (deleted with it), in the pods' imagePullSecrets
    (the seed's image is on nvcr.io)."""
    run.engine.credentials.set(
        "tester",
        "ngc",
        "REGISTRY",
        {"registry": "nvcr.io", "username": "$oauthtoken", "auth": "ngc-api-key"},
    )
    wid = run.submit(SEED)
    pods = _pods(emulator, wid, 2)
    [secret] = [
        s for s in emulator.objects("secrets") if s.get("type") == "kubernetes.io/dockerconfigjson"
    ]
    assert secret["metadata"]["ownerReferences"][0]["name"] == f"ty-{wid}"
    name = secret["metadata"]["name"]
    assert all({"name": name} in p["spec"]["imagePullSecrets"] for p in pods)
    _finish(emulator, [p["metadata"]["name"] for p in pods])
    assert run.status(wid) == "COMPLETED"
    _delete_leaves_nothing(run, emulator, wid)
    assert name not in [s["metadata"]["name"] for s in emulator.objects("secrets")]
