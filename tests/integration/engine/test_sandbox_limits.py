"""A task gets the limits a container gets, from its spec's resources (issue "Nothing a task
sends reaches the host": a task with ``memory: 1Gi`` touched 3 GiB; no pids limit; tasks
lived in the server's control group).

Each test is the attack through the real engine and bubblewrap sandbox: over its memory
limit the task is killed with a reason of its own (Kubernetes' ``OOMKilled``); a fork bomb
stops at the pool's ``pids_max``; the task sits in a control group of its own; a pool with
``limits: false`` (rehearsal) sets none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

from trainyard.linux.cgroups import CgroupUnavailable, cgroup_root
from trainyard.status import Status

GREEDY = """
workflow:
  name: greedy
  resources:
    default:
      cpu: 1
      memory: 64Mi
  tasks:
  - name: t
    command: [sh, -c]
    args:
    - |
      grep -E 'memory|pids' /proc/self/cgroup | sed 's/^/cgroup /'
      {{python}} -c "x = b'a' * (256 << 20); print('allocated', len(x))"
"""

FORKS = """
workflow:
  name: forks
  tasks:
  - name: t
    command: ["{{python}}", -c]
    args:
    - |
      import os, signal, time
      children = []
      for _ in range(100):
          try:
              pid = os.fork()
          except OSError as exc:
              print("fork refused:", exc.strerror)
              break
          if pid == 0:
              time.sleep(30)
              os._exit(0)
          children.append(pid)
      print(f"started={len(children)}")
      for pid in children:
          os.kill(pid, signal.SIGKILL)
"""


def _require_cgroups() -> None:
    try:
        cgroup_root()
    except CgroupUnavailable as exc:
        pytest.skip(f"no control groups here: {exc}")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    require_bwrap()
    _require_cgroups()
    made = tmp_path / "home"
    made.mkdir()
    return made


@pytest.fixture
def run(home: Path) -> Iterator[EngineRun]:
    made = EngineRun(home, pids_max=40)
    yield made
    made.close()


def test_over_its_memory_limit_a_task_is_oom_killed_with_a_reason(run: EngineRun) -> None:
    import sys

    wid = run.run(GREEDY, python=sys.executable)
    task = run.engine.state(wid).tasks["t"]
    log = run.log(wid, "t")
    assert task.status is Status.FAILED and task.exit_code == 137, log
    assert "allocated" not in log
    assert "OOMKilled" in log and "67108864 bytes" in log
    assert "trainyard/greedy-1-t-0-" in log  # its own group, not the server's


def test_a_fork_bomb_stops_at_the_pools_pids_max(run: EngineRun) -> None:
    import sys

    wid = run.run(FORKS, python=sys.executable)
    log = run.log(wid, "t")
    started = int(log.split("started=")[1].split()[0])
    assert 0 < started < 40 and "fork refused: Resource temporarily unavailable" in log, log


def test_a_pool_without_limits_sets_none(home: Path) -> None:
    import sys

    made = EngineRun(home, limits=False)
    try:
        wid = made.run(GREEDY, python=sys.executable)
        log = made.log(wid, "t")
        assert made.engine.state(wid).tasks["t"].status is Status.COMPLETED, log
        assert f"allocated {256 << 20}" in log and "trainyard/" not in log
    finally:
        made.close()
