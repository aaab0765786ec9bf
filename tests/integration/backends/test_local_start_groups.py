"""``LocalBackend.start_groups`` with a real launcher and real sandboxes (issue 11,
throughput): several gangs started without waiting for one launcher reply per task, each
task's facts its own, a refused gang failing alone and nothing of it started."""

from __future__ import annotations

import json

from local_support import final, group_launches, task_log, wait_final

from trainyard.backends.base import FactKind
from trainyard.backends.local import LocalBackend


def test_several_gangs_start_in_one_call_each_with_its_own_facts(
    backend: LocalBackend, home
) -> None:
    gangs = [
        group_launches(
            backend,
            home,
            "wf-many",
            {f"t{i}": {"command": ["sh", "-c", f"echo gang {i}; exit {i}"]}},
            group=f"g{i}",
        )
        for i in range(6)
    ]
    gangs.append(
        group_launches(
            backend,
            home,
            "wf-many",
            {
                "lead": {"command": ["sh", "-c", "echo lead"]},
                "worker": {"command": ["sh", "-c", "echo worker"]},
            },
            group="pair",
            barrier=True,
        )
    )
    assert backend.start_groups(gangs) == [None] * len(gangs)
    launches = [launch for gang in gangs for launch in gang]
    facts = wait_final(backend, [launch.key for launch in launches])
    for i, launch in enumerate(launches[:6]):
        kinds = [f.kind for f in facts[launch.key]]
        assert kinds == [FactKind.INITIALIZING, FactKind.RUNNING, FactKind.EXITED]
        assert final(facts[launch.key]).exit_code == i
        assert f"[t{i}] gang {i}" in task_log(launch)
        record = json.loads((launch.run_dir / "launch.json").read_text())
        assert record["pid"] == backend._attempts[launch.key].pid
        assert record["group"] == f"g{i}"
    assert [final(facts[launch.key]).exit_code for launch in launches[6:]] == [0, 0]


def test_a_refused_gang_fails_alone_and_none_of_its_tasks_runs(backend: LocalBackend, home) -> None:
    good = group_launches(backend, home, "wf-mixed", {"ok": {"command": ["true"]}}, group="a")
    bad = group_launches(
        backend,
        home,
        "wf-mixed",
        {
            "first": {"command": ["sh", "-c", "echo ran"]},
            "second": {"command": ["true"], "host_network": True},
        },
        group="b",
    )  # not allowed here
    after = group_launches(backend, home, "wf-mixed", {"later": {"command": ["true"]}}, group="c")
    results = backend.start_groups([good, bad, after])
    assert results[0] is None and results[2] is None
    assert "group 'b'" in str(results[1]) and "hostNetwork" in str(results[1])
    facts = wait_final(backend, [good[0].key, after[0].key])
    assert final(facts[good[0].key]).exit_code == 0 and final(facts[after[0].key]).exit_code == 0
    assert all(launch.key not in backend._attempts for launch in bad)
    assert not (bad[0].run_dir / "launch.json").exists()
