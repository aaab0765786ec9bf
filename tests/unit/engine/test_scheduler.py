from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.engine.scheduler import Placement, Request, Scheduler
from trainyard.pools import NodeSpec, Pool


def _pool(n: int = 2, gpu: int = 8, cpu: float = 16, platform: str | None = None) -> Pool:
    nodes = [NodeSpec(name=f"n{i}", gpu=gpu, cpu=cpu, platform=platform) for i in range(n)]
    return Pool(name="p", nodes=nodes)


def test_gang_is_placed_whole_on_distinct_nodes() -> None:
    sched = Scheduler(_pool())
    sched.enqueue(("w", "g"), {"master": Request(gpu=8), "worker": Request(gpu=8)})
    [(key, placements)] = sched.place_ready()
    assert key == ("w", "g")
    assert {p.node for p in placements.values()} == {"n0", "n1"}
    assert all(p.gpu_slots == tuple(range(8)) for p in placements.values())


def test_gang_that_does_not_fit_whole_waits_and_blocks_later_gangs() -> None:
    sched = Scheduler(_pool().model_copy(update={"backfill_age_s": 0.0}))  # no backfill
    sched.enqueue(("w1", "g"), {"a": Request(gpu=8)})
    assert len(sched.place_ready()) == 1
    sched.enqueue(("w2", "big"), {"a": Request(gpu=8), "b": Request(gpu=8)})
    sched.enqueue(("w3", "small"), {"a": Request(gpu=1)})
    assert sched.place_ready() == []
    assert sched.queued() == [("w2", "big"), ("w3", "small")]
    sched.release(("w1", "g"))
    placed = [key for key, _ in sched.place_ready()]
    assert placed == [("w2", "big")]
    assert sched.queued() == [("w3", "small")]


def test_gpu_slots_are_exclusive_and_reused_after_release() -> None:
    sched = Scheduler(_pool(n=1, gpu=4))
    sched.enqueue(("w1", "g"), {"a": Request(gpu=2)})
    sched.enqueue(("w2", "g"), {"a": Request(gpu=2)})
    (_, p1), (_, p2) = sched.place_ready()
    assert set(p1["a"].gpu_slots).isdisjoint(p2["a"].gpu_slots)
    sched.release(("w1", "g"))
    sched.enqueue(("w3", "g"), {"a": Request(gpu=2)})
    [(_, p3)] = sched.place_ready()
    assert p3["a"].gpu_slots == p1["a"].gpu_slots


def test_platform_and_nodes_excluded_are_respected() -> None:
    pool = Pool(
        name="p", nodes=[NodeSpec(name="a", platform="x"), NodeSpec(name="b", platform="y")]
    )
    sched = Scheduler(pool)
    sched.enqueue(("w", "g"), {"t": Request(platform="y")})
    [(_, placements)] = sched.place_ready()
    assert placements["t"].node == "b"
    sched.enqueue(("w2", "g"), {"t": Request(nodes_excluded=frozenset({"a", "b"}))})
    assert sched.place_ready() == []


def test_cpu_memory_storage_counted_per_node() -> None:
    sched = Scheduler(_pool(n=1, cpu=4))
    sched.enqueue(("w", "g"), {"a": Request(cpu=3), "b": Request(cpu=2)})
    assert sched.place_ready() == []


def test_restore_counts_usage_again() -> None:
    sched = Scheduler(_pool(n=1, gpu=2))
    sched.restore(("w", "g"), {"a": Request(gpu=2)}, {"a": Placement("n0", (0, 1))})
    sched.enqueue(("w2", "g"), {"a": Request(gpu=1)})
    assert sched.place_ready() == []
    assert sched.placement_of(("w", "g")) == {"a": Placement("n0", (0, 1))}


def test_on_a_node_per_task_pool_a_gang_never_shares_a_node() -> None:
    small = [NodeSpec(name=f"n{i}", cpu=16) for i in range(2)]
    shared = Scheduler(Pool(name="p", nodes=small))
    slurm = Scheduler(Pool(name="s", backend="slurm", nodes=small))
    three = {t: Request(cpu=1) for t in ("a", "b", "c")}
    shared.enqueue(("w", "g"), three)
    [(_, placements)] = shared.place_ready()  # the local pool packs the third task
    assert sorted(p.node for p in placements.values()) == ["n0", "n0", "n1"]
    slurm.enqueue(("w", "g"), three)
    assert slurm.place_ready() == []  # three nodes are needed: it waits
    slurm.dequeue(("w", "g"))
    slurm.enqueue(("w", "two"), {"a": Request(cpu=1), "b": Request(cpu=1)})
    [(_, placements)] = slurm.place_ready()
    assert {p.node for p in placements.values()} == {"n0", "n1"}


def test_a_gang_that_does_not_fit_now_lets_smaller_ones_behind_it_start_first() -> None:
    """Issue 12, H4: backfill while the head of the queue is younger than backfill_age_s."""
    sched = Scheduler(_pool())  # backfill_age_s: 300 (the default)
    sched.enqueue(("w1", "g"), {"a": Request(gpu=8)}, now_s=0.0)
    assert len(sched.place_ready(now_s=0.0)) == 1
    sched.enqueue(("w2", "big"), {"a": Request(gpu=8), "b": Request(gpu=8)}, now_s=1.0)
    sched.enqueue(("w3", "small"), {"a": Request(gpu=1)}, now_s=2.0)
    assert [key for key, _ in sched.place_ready(now_s=2.0)] == [("w3", "small")]
    assert sched.queued() == [("w2", "big")]


def test_a_gang_waiting_longer_than_the_age_bound_holds_the_gangs_behind_it() -> None:
    sched = Scheduler(_pool())
    sched.enqueue(("w1", "g"), {"a": Request(gpu=8)}, now_s=0.0)
    sched.place_ready(now_s=0.0)
    sched.enqueue(("w2", "big"), {"a": Request(gpu=8), "b": Request(gpu=8)}, now_s=1.0)
    sched.enqueue(("w3", "small"), {"a": Request(gpu=1)}, now_s=400.0)
    assert sched.place_ready(now_s=400.0) == []  # big has waited 399 s > 300 s: it reserves
    sched.release(("w1", "g"))
    assert [key for key, _ in sched.place_ready(now_s=401.0)] == [("w2", "big")]
    assert sched.queued() == [("w3", "small")]


def test_a_gang_that_did_not_fit_is_tried_again_once_nodes_are_freed() -> None:
    sched = Scheduler(_pool(n=1))
    sched.enqueue(("w1", "g"), {"a": Request(gpu=8)}, now_s=0.0)
    sched.place_ready(now_s=0.0)
    sched.enqueue(("w2", "g"), {"a": Request(gpu=4)}, now_s=0.0)
    assert sched.place_ready(now_s=1.0) == [] and sched.place_ready(now_s=2.0) == []
    sched.release(("w1", "g"))
    assert [key for key, _ in sched.place_ready(now_s=3.0)] == [("w2", "g")]


def test_fits_empty_tells_a_gang_that_can_never_fit() -> None:
    sched = Scheduler(_pool(n=2, cpu=16))
    assert sched.fits_empty({f"t{i}": Request(cpu=8) for i in range(4)})
    assert not sched.fits_empty({f"t{i}": Request(cpu=10) for i in range(3)})


def test_a_higher_priority_gang_is_placed_before_lower_ones_queued_earlier() -> None:
    """OSMO's priorities: HIGH before NORMAL before LOW; within one, submission order."""
    from trainyard.engine.scheduler import PRIORITY_RANK

    sched = Scheduler(_pool(n=1).model_copy(update={"backfill_age_s": 0.0}))
    sched.enqueue(("busy", "g"), {"a": Request(gpu=8)})
    assert len(sched.place_ready()) == 1  # the node is full: the next ones queue
    for wid, priority in (
        ("low", "LOW"),
        ("normal", "NORMAL"),
        ("high", "HIGH"),
        ("normal2", "NORMAL"),
    ):
        sched.enqueue((wid, "g"), {"a": Request(gpu=8)}, rank=PRIORITY_RANK[priority])
    assert sched.queued() == [("high", "g"), ("normal", "g"), ("normal2", "g"), ("low", "g")]
    sched.release(("busy", "g"))
    assert [key for key, _ in sched.place_ready()] == [("high", "g")]


def _naive_fit(scheduler: Scheduler, requests: dict[str, Request]) -> dict[str, Placement] | None:
    """The placement rule written out as the minimum over all nodes per task, O(tasks x
    nodes): what ``Scheduler._fit``'s ordered scan must agree with."""
    trial = {name: u.copy() for name, u in scheduler.usage.items()}
    used: set[str] = set()
    placements = {}
    for task, req in sorted(
        requests.items(),
        key=lambda kv: (kv[1].gpu, kv[1].cpu, kv[1].memory_bytes, kv[1].storage_bytes),
        reverse=True,
    ):
        candidates = [
            u
            for u in trial.values()
            if u.fits(req) and not (scheduler.pool.node_per_task and u.node.name in used)
        ]
        if not candidates:
            return None
        best = min(candidates, key=lambda u: (u.node.name in used, len(u.gpu_slots), u.cpu))
        placements[task] = Placement(best.node.name, trial[best.node.name].take(req))
        used.add(best.node.name)
    return placements


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(st.integers(0, 8), st.sampled_from([4.0, 16.0, 64.0])), min_size=1, max_size=8
    ),
    busy=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 7)), max_size=4),
    tasks=st.lists(
        st.tuples(st.integers(0, 8), st.sampled_from([0.0, 1.0, 4.0, 8.0])), min_size=1, max_size=10
    ),
    node_per_task=st.booleans(),
)
def test_the_ordered_scan_places_as_the_minimum_over_all_nodes(
    nodes: list[tuple[int, float]],
    busy: list[tuple[int, int]],
    tasks: list[tuple[int, float]],
    node_per_task: bool,
) -> None:
    pool = Pool(
        name="p",
        nodes=[NodeSpec(name=f"n{i}", gpu=g, cpu=c) for i, (g, c) in enumerate(nodes)],
        backend="slurm" if node_per_task else "local",
    )
    scheduler = Scheduler(pool)
    for i, (node, gpus) in enumerate(busy):  # some nodes partly taken by other gangs
        if node < len(nodes) and gpus <= nodes[node][0]:
            name = f"n{node}"
            request = Request(cpu=1.0, gpu=gpus)
            if scheduler.usage[name].fits(request):
                scheduler.restore(
                    ("other", str(i)),
                    {"t": request},
                    {"t": Placement(name, scheduler.usage[name].copy().take(request))},
                )
    requests = {f"t{i}": Request(cpu=c, gpu=g) for i, (g, c) in enumerate(tasks)}
    assert scheduler._fit(requests) == _naive_fit(scheduler, requests)
