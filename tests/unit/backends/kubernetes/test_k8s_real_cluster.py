"""The end-to-end tests against a real cluster: run when ``KUBECONFIG`` names one (marker
``kubernetes_cluster``), skipped with the reason otherwise (no cluster can run on the
project's machines). The kubelet is real here: pods run the runner image
(``TRAINYARD_TEST_RUNNER_IMAGE``, built from deploy/runner/Dockerfile and loadable by the
cluster: ``kind load docker-image``) and the tasks' image ``python:3.12-slim``; objects go
to ``TRAINYARD_TEST_NAMESPACE`` (default ``default``). docs/kubernetes.md says how on kind.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8s_support import pool

from trainyard import spec
from trainyard.backends.kubernetes.client import KubeApi
from trainyard.backends.kubernetes.names import WORKFLOW_LABEL
from trainyard.engine.reconciler import Engine, Submission
from trainyard.store import Store

pytestmark = [
    pytest.mark.kubernetes_cluster,
    pytest.mark.skipif(
        not os.environ.get("KUBECONFIG"),
        reason="no KUBECONFIG: these run against a real cluster (kind: see "
        "docs/kubernetes.md, 'Tests')",
    ),
]
TIMEOUT_S = 600
RENDEZVOUS = """workflow:
  name: rendezvous
  groups:
  - name: pair
    tasks:
    - name: master
      lead: true
      image: python:3.12-slim
      command: [python3, -c]
      args: ["import socket; s = socket.create_server(('', 29400)); c, _ = s.accept(); c.sendall(b'hi')"]
    - name: worker
      image: python:3.12-slim
      command: [python3, -c]
      args: ["import socket, time\\nfor _ in range(120):\\n    try:\\n        print(socket.create_connection(('{{host:master}}', 29400)).recv(2)); break\\n    except OSError:\\n        time.sleep(1)\\nelse:\\n    raise SystemExit(3)"]
"""


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Engine, object]]:
    options = {
        "namespace": os.environ.get("TRAINYARD_TEST_NAMESPACE", "default"),
        "runner_image": os.environ.get("TRAINYARD_TEST_RUNNER_IMAGE", "trainyard-runner:0.1.0"),
        "requests": ["cpu", "memory"],
    }
    the_pool = pool(options)
    made = Engine(
        Store(f"sqlite:///{tmp_path / 'db.sqlite'}"), tmp_path, pools={the_pool.name: the_pool}
    )
    stop = threading.Event()
    thread = threading.Thread(target=made.run_forever, args=(stop,), daemon=True)
    thread.start()
    yield made, the_pool
    stop.set()
    thread.join(timeout=10)
    made.close()


def _left(the_pool: object, wid: str) -> list[dict[str, object]]:
    from trainyard.backends.kubernetes import parse_options

    api = KubeApi(parse_options("k8s", dict(the_pool.options)))  # type: ignore[attr-defined]
    try:
        return api.list_pods(f"{WORKFLOW_LABEL}={wid}")[0]
    finally:
        api.close()


def test_two_tasks_meet_at_host_master_and_nothing_is_left(engine: tuple[Engine, object]) -> None:
    run, the_pool = engine
    doc = spec.load(RENDEZVOUS, pool=the_pool)  # type: ignore[arg-type]
    wid = run.submit(
        Submission(spec=doc.workflow, spec_text=RENDEZVOUS, user="tester", pool=the_pool)
    ).id  # type: ignore[arg-type]
    assert str(run.wait(wid, TIMEOUT_S).status) == "COMPLETED"
    run.delete([wid])  # `workflow delete`: the backend deletes the workflow's ConfigMap
    deadline = time.monotonic() + 120
    while _left(the_pool, wid):  # the garbage collector deletes what the ConfigMap owned
        assert time.monotonic() < deadline, "objects of the workflow left behind"
        time.sleep(2)
