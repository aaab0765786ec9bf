"""What the trainer reports: the console lines and the JSON lines of ``metrics.jsonl``.

The console lines are exactly those of the Slurm multi-node seed (``Epoch 95/100 completed in
0.771 seconds``, ``Validation Loss: ...``, ``Training Summary:`` ...; the full text in
docs/training.md, "Console lines"). ``metrics.jsonl`` holds one JSON object per line with
``event`` (``start``, ``epoch``, ``early_stop``, ``failure``, ``summary``) and ``time`` (UTC,
ISO 8601); appended, so a rescheduled run adds its lines after the failed run's. Fields of
each event: docs/training.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["epoch_lines", "summary_lines", "MetricsLog", "METRICS_FILE"]

METRICS_FILE = "metrics.jsonl"


def epoch_lines(
    epoch: int,
    total_epochs: int,
    epoch_time_s: float,
    val_loss: float,
    val_accuracy: float,
    throughput_images_per_s: float,
) -> list[str]:
    """The three lines printed after each epoch (``epoch`` counts from 1)."""
    return [
        f"Epoch {epoch}/{total_epochs} completed in {epoch_time_s:.3f} seconds",
        f"Validation Loss: {val_loss:.4f}, Validation Accuracy: {val_accuracy:.4f}",
        f"Epoch Throughput: {throughput_images_per_s:.3f} images/second",
    ]


def summary_lines(
    total_time_s: float,
    throughput_images_per_s: float,
    workers_per_node: Sequence[int],
    accelerator: str = "GPU",
) -> list[str]:
    """The ``Training Summary`` block (preceded by a blank line).

    Args:
        workers_per_node: worker count of each node (its length is the node count).
        accelerator: ``GPU`` or ``process``, the word for one worker.
    """
    word = "GPUs" if accelerator == "GPU" else "processes"
    counts = sorted(set(workers_per_node))
    per_node = str(counts[0]) if len(counts) == 1 else ", ".join(str(n) for n in workers_per_node)
    return [
        "",
        "Training Summary:",
        f"Total training time: {total_time_s:.3f} seconds",
        f"Throughput: {throughput_images_per_s:.3f} images/second",
        f"Number of nodes: {len(workers_per_node)}",
        f"Number of {word} per node: {per_node}",
        f"Total {word} used: {sum(workers_per_node)}",
        "Training completed successfully.",
    ]


class MetricsLog:
    """Appends JSON lines to ``folder/metrics.jsonl`` (one writer: global rank 0).

    Each line is flushed and synced when written, so a killed run keeps what it reported.
    """

    def __init__(self, folder: str | Path, filename: str = METRICS_FILE) -> None:
        self.path = Path(folder) / filename

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one record ``{"event": event, "time": now, **fields}`` and return it."""
        record = {"event": event, "time": datetime.now(UTC).isoformat(), **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return record

    def read(self) -> list[dict[str, Any]]:
        """Every record written so far (skips a torn last line)."""
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records
