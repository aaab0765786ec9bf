"""The one table from Slurm job states to backend facts (STYLE.md #4).

Source: squeue(1) and sacct(1), "JOB STATE CODES". A job state never becomes a status: the
runner's ``events.jsonl`` reports INITIALIZING, RUNNING and EXITED; the job state only says
what happened to an attempt that did not report its exit.

``None`` in the table means the job is alive (queued, starting, running, finishing): its
attempts report through their events. A state that ended the job maps to the fact an
attempt without an EXITED event gets. A state missing from the table (a newer Slurm, or
``UNKNOWN`` when neither squeue nor sacct knows the job) is a backend error: LOST.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainyard.backends.base import FactKind

__all__ = [
    "SLURM_STATES",
    "UNKNOWN",
    "PENDING_REASONS",
    "fact_for_state",
    "is_alive",
    "pending_reason",
]

UNKNOWN = "UNKNOWN"
"""What trainyard calls a job that neither squeue nor sacct knows (any more)."""

SLURM_STATES: dict[str, FactKind | None] = {
    # alive: the runner's events tell
    "PENDING": None,
    "CONFIGURING": None,
    "RUNNING": None,
    "COMPLETING": None,
    "SUSPENDED": None,
    "STOPPED": None,
    "SIGNALING": None,
    "STAGE_OUT": None,
    "RESIZING": None,
    "RESV_DEL_HOLD": None,
    "REQUEUE_HOLD": None,
    "REQUEUE_FED": None,
    "REQUEUED": None,
    # ended: an attempt without an EXITED event
    "BOOT_FAIL": FactKind.START_ERROR,  # the nodes never booted: nothing ran
    "CANCELLED": FactKind.LOST,
    "COMPLETED": FactKind.LOST,  # the batch script ended but this runner never reported
    "DEADLINE": FactKind.LOST,
    "FAILED": FactKind.LOST,
    "NODE_FAIL": FactKind.LOST,
    "OUT_OF_MEMORY": FactKind.LOST,
    "PREEMPTED": FactKind.LOST,
    "REVOKED": FactKind.LOST,
    "SPECIAL_EXIT": FactKind.LOST,
    "TIMEOUT": FactKind.LOST,
}


def _base(state: str) -> str:
    """``CANCELLED by 0`` (sacct) -> ``CANCELLED``; ``COMPLETED+`` -> ``COMPLETED``."""
    return state.strip().split(" ")[0].rstrip("+").upper()


def is_alive(state: str) -> bool:
    """True while the job holds (or waits for) its nodes: its attempts may still report."""
    base = _base(state)
    return base in SLURM_STATES and SLURM_STATES[base] is None


def fact_for_state(state: str) -> FactKind:
    """The fact for an attempt whose job ended in ``state`` without the attempt's EXITED
    event (only meaningful when ``is_alive(state)`` is False). Unknown states give LOST."""
    return SLURM_STATES.get(_base(state)) or FactKind.LOST


PENDING_REASONS: dict[str, str] = {
    "Resources": "it waits for resources (nodes, CPUs, GPUs, memory) to be free",
    "Priority": "jobs of higher priority are ahead of it in the partition's queue",
    "ReqNodeNotAvail": "a node it needs is not available (down, drained or reserved)",
    "QOSMaxJobsPerUserLimit": "the QOS allows no more running jobs per user",
    "AssocMaxJobsLimit": "the association allows no more running jobs",
    "AssocGrpGRES": "the association's GPU (GRES) limit is reached",
    "QOSGrpGRES": "the QOS's GPU (GRES) limit is reached",
    "PartitionNodeLimit": "it asks more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit is over the partition's",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "NodeDown": "a node it needs is down",
    "BeginTime": "its start time has not come yet",
    "Dependency": "it waits for a job it depends on",
    "JobHeldUser": "its user holds it (scontrol release)",
    "JobHeldAdmin": "an administrator holds it",
    "Reservation": "it waits for its reservation to start",
    "Licenses": "it waits for a license",
    "None": "Slurm has not looked at it yet",
}
"""Plain words for squeue's ``%r`` of a PENDING job (squeue(1), "JOB REASON CODES"); a
reason not here is shown in Slurm's word only."""


BEHIND_SHOWN = 3
"""How many of the jobs a pending job waits behind its reason names (then ``and N more``)."""


def pending_reason(job_id: str, reason: str, behind: Sequence[str] = ()) -> str:
    """One line for the waiting reason of a gang whose Slurm job is PENDING.

    Args:
        job_id: the pending job.
        reason: squeue's ``%r``.
        behind: the running jobs it waits behind, each in words (``Slurm job 6 'hog' of
            alice on ty-node1``); the first ``BEHIND_SHOWN`` are named.

    >>> pending_reason("7", "Priority")
    "Slurm job 7 is PENDING (Priority): jobs of higher priority are ahead of it in the partition's queue"
    >>> pending_reason("7", "Resources", ["Slurm job 6 'hog' of bob on n1"]).split("; ")[1]
    "behind Slurm job 6 'hog' of bob on n1"
    """
    words = PENDING_REASONS.get(reason.split(",")[0].strip())
    plain = f": {words}" if words else ""
    line = f"Slurm job {job_id} is PENDING ({reason or 'no reason given'}){plain}"
    if behind:
        more = len(behind) - BEHIND_SHOWN
        line += "; behind " + ", ".join(behind[:BEHIND_SHOWN])
        line += f" and {more} more" if more > 0 else ""
    return line
