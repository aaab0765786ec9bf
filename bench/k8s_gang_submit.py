"""Kubernetes backend: submit -> all pods created for one gang, and the engine's cost per pod
event, against kmock's API emulator on loopback, served by a process of its own so that its
serving is not the measured process's (issue 26). Not a test.

For each repeat: a fresh emulator and engine; one workflow of one group of ``--tasks`` tasks
on a Kubernetes pool of as many nodes; measured:

- ``submit_to_pods_s``: from ``Engine.submit`` to the last of the gang's pods existing in
  the emulator (placement, manifests, the owner, Service, one Secret and one Pod per task
  over HTTP), and this process's CPU time over it (the emulator's is not in it);
- ``events_s_per_pod``: the test kubelet marks every pod Running then Succeeded (two status
  patches per pod, sent as fast as it can); from the first patch to the workflow COMPLETED,
  divided by the number of pod events (2 per pod): watch -> poll -> facts -> state machine ->
  store, with the emulator serving on the same 2 cores; ``engine_cpu_ms_per_event``: this
  process's CPU time over that span per event (engine and watch; the kubelet's patches too).

Usage:
    .venv/bin/python bench/k8s_gang_submit.py [--tasks 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "unit" / "backends" / "kubernetes"))

from k8s_emulator import NAMESPACE, EmulatorClient, Kubelet  # noqa: E402

from trainyard import spec  # noqa: E402
from trainyard.engine.reconciler import Engine, Submission  # noqa: E402
from trainyard.pools import NodeSpec, Pool  # noqa: E402
from trainyard.store import Store  # noqa: E402


def _spec(tasks: int) -> str:
    lines = [
        "workflow:",
        "  name: gang",
        "  resources:",
        "    default: {cpu: 1, gpu: 1}",
        "  groups:",
        "  - name: g",
        "    tasks:",
    ]
    for index in range(tasks):
        lines += [f"    - name: t{index}", "      image: busybox", "      command: [\"true\"]"]
        if index == 0:
            lines.append("      lead: true")
    return "\n".join(lines) + "\n"


def _one(tasks: int) -> tuple[float, float, float, float]:
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        server = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "tests" / "unit" / "backends" / "kubernetes" / "k8s_emulator.py"),
                str(home),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        emulator = EmulatorClient(home / "kubeconfig")
        the_pool = Pool(
            name="k8s",
            backend="kubernetes",
            nodes=[NodeSpec(name=f"n{i}", cpu=8, gpu=8) for i in range(tasks)],
            options={"namespace": NAMESPACE, "kubeconfig": str(emulator.kubeconfig)},
        )
        engine = Engine(Store(f"sqlite:///{home / 'db.sqlite'}"), home, pools={"k8s": the_pool})
        stop = threading.Event()
        thread = threading.Thread(target=engine.run_forever, args=(stop,), daemon=True)
        thread.start()
        try:
            text = _spec(tasks)
            doc = spec.load(text, pool=the_pool)
            start, cpu = time.perf_counter(), time.process_time()
            wid = engine.submit(
                Submission(spec=doc.workflow, spec_text=text, user="bench", pool=the_pool)
            ).id
            while len(emulator.pods_of(wid)) < tasks:  # a list every 50 ms, not more
                time.sleep(0.05)
            created_s = time.perf_counter() - start
            created_cpu_s = time.process_time() - cpu
            names = [p["metadata"]["name"] for p in emulator.pods_of(wid)]
            kubelet = Kubelet(emulator)
            start, cpu = time.perf_counter(), time.process_time()
            for name in names:
                kubelet.run(name)
            for name in names:
                kubelet.exit(name, 0)
            status = engine.wait(wid, 300).status
            events_s = (time.perf_counter() - start) / (2 * tasks)
            cpu_s = (time.process_time() - cpu) / (2 * tasks)
            assert str(status) == "COMPLETED", status
            return created_s, created_cpu_s, events_s, cpu_s
        finally:
            stop.set()
            thread.join(timeout=10)
            engine.close()
            server.kill()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    created, events, cpus = [], [], []
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    for index in range(args.repeat):
        c, cu, e, u = _one(args.tasks)
        created.append(c)
        events.append(e)
        cpus.append(u)
        print(
            f"run {index + 1}: submit -> {args.tasks} pods {c:.3f} s ({cu:.3f} s CPU of "
            f"this process); {e * 1000:.2f} ms per pod event, {u * 1000:.2f} ms CPU of "
            f"this process"
        )
    print(
        f"median: submit -> {args.tasks} pods {statistics.median(created):.3f} s "
        f"(min {min(created):.3f}, max {max(created):.3f}); "
        f"{statistics.median(events) * 1000:.2f} ms per pod event "
        f"(min {min(events) * 1000:.2f}, max {max(events) * 1000:.2f}); "
        f"{statistics.median(cpus) * 1000:.2f} ms CPU per pod event"
    )


if __name__ == "__main__":
    main()
