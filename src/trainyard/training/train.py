"""A DDP trainer for OSMO-style workflows: ``python -m trainyard.training.train`` or
``torchrun ... -m trainyard.training.train``.

Reads torchrun's environment (:mod:`trainyard.training.dist`); ``nccl`` on GPUs, ``gloo`` on
CPUs, a world of one without torchrun. Flags are those of OSMO's torchrun samples
(``--total_epochs``, ``--batch_size``, ``--snapshot_path``, ``--save_every``, ``--error_log``)
plus ``--target-accuracy``, ``--patience`` and a few more; each also takes the other spelling.
A restarted run continues at the first epoch not completed and ends bit-identical to an
uninterrupted one. Exit codes: 0 done (or already complete), 1 training failed, 2 bad
arguments, dataset, environment or corrupt snapshot. On failure each failing worker writes
``<error_log>.<global rank>``. Resume, elastic and exit contracts and the metrics.jsonl
fields: docs/training.md.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import io
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from trainyard.training.data import DATASETS, DatasetSplits, load_dataset
from trainyard.training.determinism import (
    Reproducibility,
    enable_deterministic,
    seed_everything,
    torch_version,
)
from trainyard.training.dist import (
    DistEnv,
    NodeLayout,
    Runtime,
    init_distributed,
    node_layout,
    shutdown,
)
from trainyard.training.errors import (
    DatasetError,
    DistributedSetupError,
    InjectedFailure,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotMismatchError,
)
from trainyard.training.models import MODELS, build_model
from trainyard.training.report import MetricsLog, epoch_lines, summary_lines
from trainyard.training.snapshot import (
    capture_rng_state,
    decode_snapshot,
    read_snapshot_bytes,
    restore_rng_state,
    save_snapshot,
)

__all__ = [
    "TrainConfig",
    "EpochResult",
    "Trainer",
    "build_parser",
    "config_from_args",
    "derive_seed",
    "main",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SNAPSHOT_FILENAME = "snapshot.pth"
EVAL_BATCH_SIZE = 1024
MOMENTUM = 0.9


@dataclass(frozen=True)
class TrainConfig:
    """Validated trainer settings (see :func:`build_parser` for each flag)."""

    total_epochs: int = 10
    batch_size: int = 32
    snapshot_path: Path = Path(SNAPSHOT_FILENAME)
    save_every: int = 1
    error_log: Path | None = None
    lr: float = 0.05
    seed: int = 0
    target_accuracy: float | None = None
    patience: int = 1
    dataset: str = "digits"
    data_dir: Path | None = None
    model: str = "mlp"
    metrics_dir: Path = Path(".")
    fail_at_epoch: int | None = None
    deterministic: bool = False

    def snapshot_due(self, epochs_completed: int) -> bool:
        """Whether a snapshot is written after ``epochs_completed`` epochs."""
        return epochs_completed % self.save_every == 0 or epochs_completed == self.total_epochs


@dataclass(frozen=True)
class EpochResult:
    """What one epoch measured (global figures, identical on every rank)."""

    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float
    images: int
    epoch_time_s: float
    val_time_s: float

    @property
    def throughput_images_per_s(self) -> float:
        return self.images / self.epoch_time_s if self.epoch_time_s > 0 else 0.0


# ---------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    """The trainer's command line (OSMO sample flags first; both spellings accepted)."""
    parser = argparse.ArgumentParser(
        prog="python -m trainyard.training.train",
        description="DDP trainer with atomic snapshots and exact resume (torchrun or single process).",
    )
    add = parser.add_argument
    add(
        "--total_epochs",
        "--total-epochs",
        type=int,
        default=10,
        help="epochs to train (default 10)",
    )
    add(
        "--batch_size",
        "--batch-size",
        type=int,
        default=32,
        help="batch size per process (default 32)",
    )
    add(
        "--snapshot_path",
        "--snapshot-path",
        default=SNAPSHOT_FILENAME,
        help="snapshot file, or a folder to hold snapshot.pth (default ./snapshot.pth)",
    )
    add(
        "--save_every",
        "--save-every",
        type=int,
        default=1,
        help="snapshot every N epochs (default 1)",
    )
    add(
        "--error_log",
        "--error-log",
        default=None,
        help="on failure each failing worker writes ERROR_LOG.<rank> (OSMO reschedule sample)",
    )
    add("--lr", type=float, default=0.05, help="SGD learning rate, cosine-annealed (default 0.05)")
    add("--seed", type=int, default=0, help="seed for weights, data order and dropout (default 0)")
    add(
        "--target-accuracy",
        "--target_accuracy",
        type=float,
        default=None,
        help="stop early once validation accuracy reaches this for --patience epochs in a row",
    )
    add(
        "--patience",
        type=int,
        default=1,
        help="consecutive epochs at target before stopping (default 1)",
    )
    add("--dataset", choices=sorted(DATASETS), default="digits", help="default: digits (bundled)")
    add(
        "--data-dir",
        "--data_dir",
        default=None,
        help="local copy of mnist (IDX) or cifar10 (python batches)",
    )
    add("--model", choices=sorted(MODELS), default="mlp", help="default: mlp")
    add(
        "--metrics-dir",
        "--metrics_dir",
        default=None,
        help="folder for metrics.jsonl (default: the snapshot's folder)",
    )
    add(
        "--fail-at-epoch",
        "--fail_at_epoch",
        type=int,
        default=None,
        help="test hook: fail half-way through epoch K (from 1) in a run that started without a snapshot",
    )
    add(
        "--deterministic",
        action="store_true",
        help="deterministic GPU kernels (torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, "
        "cuDNN without benchmarking): the same weights every run, at some speed; see docs/reproducible.md",
    )
    add("--local-rank", "--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def _snapshot_file(raw: str) -> Path:
    path = Path(raw)
    if path.is_dir() or raw.endswith(("/", "\\")):
        return path / SNAPSHOT_FILENAME
    return path


def _check_fail_at_epoch(cfg_total: int, save_every: int, fail_at: int | None) -> None:
    if fail_at is None:
        return
    if not 1 <= fail_at <= cfg_total:
        raise ValueError(
            f"--fail-at-epoch must lie in [1, --total_epochs={cfg_total}], got {fail_at}"
        )
    if fail_at - 1 < save_every:
        raise ValueError(
            f"--fail-at-epoch {fail_at} needs a snapshot before it (epoch {fail_at - 1} or earlier) "
            f"but --save_every is {save_every}: the rerun would start afresh and fail again"
        )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Check the parsed flags and build a :class:`TrainConfig`.

    Raises:
        ValueError: a value out of range (the message names the flag).
    """
    _positive("--total_epochs", args.total_epochs)
    _positive("--batch_size", args.batch_size)
    _positive("--save_every", args.save_every)
    _positive("--patience", args.patience)
    if args.lr <= 0:
        raise ValueError(f"--lr must be positive, got {args.lr}")
    if args.target_accuracy is not None and not 0 < args.target_accuracy <= 1:
        raise ValueError(f"--target-accuracy must lie in (0, 1], got {args.target_accuracy}")
    _check_fail_at_epoch(args.total_epochs, args.save_every, args.fail_at_epoch)
    snapshot = _snapshot_file(args.snapshot_path)
    return TrainConfig(
        total_epochs=args.total_epochs,
        batch_size=args.batch_size,
        snapshot_path=snapshot,
        save_every=args.save_every,
        error_log=Path(args.error_log) if args.error_log else None,
        lr=args.lr,
        seed=args.seed,
        target_accuracy=args.target_accuracy,
        patience=args.patience,
        dataset=args.dataset,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        model=args.model,
        metrics_dir=Path(args.metrics_dir) if args.metrics_dir else snapshot.absolute().parent,
        fail_at_epoch=args.fail_at_epoch,
        deterministic=args.deterministic,
    )


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers, e.g. (seed, epoch, rank): distinct inputs, unrelated seeds."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# ---------------------------------------------------------------------------- trainer


class Trainer:
    """One worker's share of a DDP training run. Every method that communicates is called on
    every rank in the same order."""

    def __init__(
        self, cfg: TrainConfig, env: DistEnv, runtime: Runtime, data: DatasetSplits
    ) -> None:
        self.cfg, self.env, self.runtime, self.data = cfg, env, runtime, data
        device = runtime.device
        seed_everything(cfg.seed)  # same initial weights on every rank; snapshot RNG states too
        self.model = build_model(cfg.model, data.input_shape, data.num_classes).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=MOMENTUM)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.optimizer, T_max=cfg.total_epochs
        )
        self.train_x = torch.from_numpy(data.train_x).to(device)
        self.train_y = torch.from_numpy(data.train_y).to(device)
        self.val_x = torch.from_numpy(data.val_x[env.rank :: env.world_size]).to(device)
        self.val_y = torch.from_numpy(data.val_y[env.rank :: env.world_size]).to(device)
        self.sampler: DistributedSampler[int] = DistributedSampler(
            # the sampler needs only len(); torch types its argument as a Dataset
            range(len(data.train_y)),  # type: ignore[arg-type]
            num_replicas=env.world_size,
            rank=env.rank,
            shuffle=True,
            seed=cfg.seed,
            drop_last=False,
        )
        self.epochs_completed = 0
        self.epochs_at_target = 0
        self.early_stopped = False
        self.resumed_from: str | None = None
        self.snapshot_source_rank: int | None = None
        self.ddp: DistributedDataParallel | None = None
        self.metrics = MetricsLog(cfg.metrics_dir) if env.is_main else None

    # ------------------------------------------------------------------ snapshot

    def state(self) -> dict[str, Any]:
        """Everything a resumed run needs, as a snapshot dict."""
        return {
            "epochs_completed": self.epochs_completed,
            "total_epochs": self.cfg.total_epochs,
            "early_stopped": self.early_stopped,
            "early_stop": {"epochs_at_target": self.epochs_at_target},
            "sampler_epoch": self.epochs_completed,
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": capture_rng_state(),
            "config": self.state_config(),
            "reproducibility": self.reproducibility().to_json(),
        }

    def reproducibility(self) -> Reproducibility:
        """What another run must share to end with these weights (module docstring)."""
        return Reproducibility(
            seed=self.cfg.seed,
            world_size=self.env.world_size,
            torch_version=torch_version(),
            deterministic=self.cfg.deterministic,
            backend=self.runtime.backend,
            device_type=self.runtime.device.type,
        )

    def state_config(self) -> dict[str, Any]:
        """The settings an exact resume depends on (kept in the snapshot, checked on resume)."""
        return {
            "dataset": self.cfg.dataset,
            "model": self.cfg.model,
            "seed": self.cfg.seed,
            "batch_size": self.cfg.batch_size,
            "lr": self.cfg.lr,
            "world_size": self.env.world_size,
            "deterministic": self.cfg.deterministic,
            "torch_version": torch_version(),
        }

    def _load_state(self, state: dict[str, Any], source: str) -> None:
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise SnapshotMismatchError(
                f"{source} does not fit --model {self.cfg.model} on --dataset {self.cfg.dataset}: {exc}"
            ) from exc
        restore_rng_state(state["rng"])
        self._warn_if_config_differs(state.get("config", {}), source)
        self.epochs_completed = state["epochs_completed"]
        self.epochs_at_target = int(state.get("early_stop", {}).get("epochs_at_target", 0))
        self.early_stopped = bool(state.get("early_stopped", False))

    def _warn_if_config_differs(self, saved: dict[str, Any], source: str) -> None:
        current = self.state_config()
        changed = [
            f"{k} {saved[k]!r} -> {current[k]!r}"
            for k in current
            if k in saved and saved[k] != current[k]
        ]
        if changed and self.env.is_main:
            print(
                f"warning: resuming {source} with changed settings ({', '.join(changed)}); "
                "the result will differ from an uninterrupted run",
                file=sys.stderr,
                flush=True,
            )

    def _local_snapshot(self) -> tuple[int, bytes | None, str]:
        """(epochs completed or -1 if none or -2 if corrupt, raw bytes, error message)."""
        try:
            raw = read_snapshot_bytes(self.cfg.snapshot_path)
            if raw is None:
                return -1, None, ""
            state = decode_snapshot(raw, str(self.cfg.snapshot_path))
            return state["epochs_completed"], raw, ""
        except SnapshotError as exc:
            return -2, None, f"[rank {self.env.rank}] {exc}"

    def restore(self) -> bool:
        """Agree with all ranks on the newest snapshot, load it everywhere; False if none.

        Raises:
            SnapshotCorruptError: some rank's snapshot file is damaged (raised on every rank).
            SnapshotMismatchError: the snapshot is of another model or optimizer (every rank).
        """
        epochs, raw, error = self._local_snapshot()
        views: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(views, (epochs, error))
        errors = [msg for e, msg in views if e == -2]
        if errors:
            raise SnapshotCorruptError("; ".join(errors))
        source = max(range(self.env.world_size), key=lambda r: (views[r][0], -r))
        if views[source][0] < 0:
            return False
        payload = [raw if self.env.rank == source else None]
        if self.env.world_size > 1:
            dist.broadcast_object_list(payload, src=source)
        label = f"{self.cfg.snapshot_path} (rank {source})"
        received = payload[0]
        if received is None:  # the source rank read it: it broadcast bytes
            raise RuntimeError(f"{label}: the snapshot did not reach this rank")
        self._load_state(decode_snapshot(received, label), label)
        self.resumed_from, self.snapshot_source_rank = str(self.cfg.snapshot_path), source
        return True

    def save(self) -> bool:
        """Write the snapshot on each node's local rank 0; True where written."""
        if not self.env.is_node_leader:
            return False
        save_snapshot(self.cfg.snapshot_path, self.state())
        return True

    def settle_buckets(self) -> None:
        """One forward/backward without an optimizer step, so that DDP rebuilds its gradient
        buckets before the first real step of every run.

        DDP's first step uses buckets in parameter order, later steps buckets rebuilt in the
        order gradients became ready. gloo's ring all-reduce adds the ranks' values in an
        order that depends on an element's offset in its bucket, so a resumed run whose first
        step (epoch k) used the initial layout would differ in the last bits from an
        uninterrupted run that used the rebuilt one. Gradients are zeroed and buffers
        (e.g. batch-norm statistics) restored afterwards; epoch seeds make the dropout draw
        here irrelevant.
        """
        assert self.ddp is not None
        buffers = {name: b.clone() for name, b in self.model.named_buffers()}
        self.ddp.train()
        index = self._batches(self.epochs_completed)[0].to(self.runtime.device)
        self.ddp(self.train_x[index]).sum().mul(0.0).backward()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, buffer in self.model.named_buffers():
                buffer.copy_(buffers[name])

    # ------------------------------------------------------------------ one epoch

    def _batches(self, epoch: int) -> list[torch.Tensor]:
        self.sampler.set_epoch(epoch)
        order = torch.tensor(list(self.sampler), dtype=torch.long)
        return list(torch.split(order, self.cfg.batch_size))

    def train_epoch(self, epoch: int, inject_failure: bool = False) -> tuple[float, int]:
        """Train epoch ``epoch`` (from 0); returns (mean training loss, images seen by all ranks).

        Raises:
            InjectedFailure: ``inject_failure`` and half of the epoch's batches are done.
        """
        assert self.ddp is not None
        torch.manual_seed(derive_seed(self.cfg.seed, epoch, self.env.rank))  # dropout masks
        self.ddp.train()
        batches = self._batches(epoch)
        fail_step = len(batches) // 2 if inject_failure else -1
        totals = torch.zeros(2, dtype=torch.float64, device=self.runtime.device)
        for step, index in enumerate(batches):
            if step == fail_step:
                raise InjectedFailure(
                    f"--fail-at-epoch {epoch + 1}: injected failure at step {step}"
                )
            index = index.to(self.runtime.device)
            inputs, labels = self.train_x[index], self.train_y[index]
            self.optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.ddp(inputs), labels)
            loss.backward()
            self.optimizer.step()
            totals[0] += loss.detach().double() * len(labels)
            totals[1] += len(labels)
        dist.all_reduce(totals)
        return (totals[0] / totals[1]).item(), int(totals[1].item())

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """(validation loss, validation accuracy) over the whole validation set, sharded by rank."""
        self.model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.runtime.device)
        for start in range(0, len(self.val_y), EVAL_BATCH_SIZE):
            inputs = self.val_x[start : start + EVAL_BATCH_SIZE]
            labels = self.val_y[start : start + EVAL_BATCH_SIZE]
            logits = self.model(inputs)
            sums[0] += F.cross_entropy(logits, labels, reduction="sum").double()
            sums[1] += (logits.argmax(dim=1) == labels).sum().double()
            sums[2] += len(labels)
        dist.all_reduce(sums)
        count = max(sums[2].item(), 1.0)
        return sums[0].item() / count, sums[1].item() / count

    def run_epoch(self, epoch: int, inject_failure: bool = False) -> EpochResult:
        """Train and validate epoch ``epoch`` (from 0), then step the LR schedule."""
        started = time.perf_counter()
        train_loss, images = self.train_epoch(epoch, inject_failure)
        trained = time.perf_counter()
        val_loss, val_accuracy = self.evaluate()
        self.scheduler.step()
        return EpochResult(
            epoch=epoch + 1,
            train_loss=train_loss,
            val_loss=val_loss,
            val_accuracy=val_accuracy,
            images=images,
            epoch_time_s=trained - started,
            val_time_s=time.perf_counter() - trained,
        )

    def update_early_stop(self, val_accuracy: float) -> bool:
        """Count epochs at target; True (and ``early_stopped``) once ``patience`` in a row."""
        target = self.cfg.target_accuracy
        if target is None:
            return False
        self.epochs_at_target = self.epochs_at_target + 1 if val_accuracy >= target else 0
        self.early_stopped = self.epochs_at_target >= self.cfg.patience
        return self.early_stopped

    # ------------------------------------------------------------------ the run

    def _say(self, *lines: str) -> None:
        if self.env.is_main:
            for line in lines:
                print(line, flush=True)

    def _log(self, event: str, **fields: Any) -> None:
        if self.metrics is not None:
            self.metrics.write(event, **fields)

    def _announce(self, layout: NodeLayout) -> None:
        first = self.epochs_completed + 1
        if self.resumed_from and not self.finished():
            self._say(
                f"Resuming from snapshot {self.resumed_from} (rank {self.snapshot_source_rank}): "
                f"{self.epochs_completed} of {self.cfg.total_epochs} epochs completed, "
                f"continuing at epoch {first}"
            )
        self._log(
            "start",
            epochs_completed=self.epochs_completed,
            first_epoch=first,
            total_epochs=self.cfg.total_epochs,
            resumed_from=self.resumed_from,
            snapshot_source_rank=self.snapshot_source_rank,
            world_size=self.env.world_size,
            nodes=layout.nodes,
            workers_per_node=list(layout.workers_per_node),
            backend=self.runtime.backend,
            device=str(self.runtime.device),
            dataset=self.cfg.dataset,
            model=self.cfg.model,
            train_images=len(self.data.train_y),
            val_images=len(self.data.val_y),
            batch_size=self.cfg.batch_size,
            lr=self.cfg.lr,
            seed=self.cfg.seed,
            torch_version=torch_version(),
            deterministic=self.cfg.deterministic,
        )

    def _report_epoch(self, result: EpochResult, saved: bool) -> None:
        self._say(
            *epoch_lines(
                result.epoch,
                self.cfg.total_epochs,
                result.epoch_time_s,
                result.val_loss,
                result.val_accuracy,
                result.throughput_images_per_s,
            )
        )
        self._log(
            "epoch",
            epoch=result.epoch,
            total_epochs=self.cfg.total_epochs,
            epoch_time_s=result.epoch_time_s,
            val_time_s=result.val_time_s,
            train_loss=result.train_loss,
            val_loss=result.val_loss,
            val_accuracy=result.val_accuracy,
            images=result.images,
            throughput_images_per_s=result.throughput_images_per_s,
            lr=self.optimizer.param_groups[0]["lr"],
            snapshot_saved=saved,
        )

    def _report_early_stop(self, result: EpochResult) -> None:
        self._say(
            f"Early stopping: validation accuracy {result.val_accuracy:.4f} >= "
            f"{self.cfg.target_accuracy:.4f} for {self.cfg.patience} consecutive epoch(s)"
        )
        self._log(
            "early_stop",
            epoch=result.epoch,
            val_accuracy=result.val_accuracy,
            target_accuracy=self.cfg.target_accuracy,
            patience=self.cfg.patience,
        )

    def _report_summary(
        self, layout: NodeLayout, results: list[EpochResult], total_time_s: float
    ) -> None:
        images = sum(r.images for r in results)
        throughput = images / total_time_s if total_time_s > 0 else 0.0
        self._say(
            *summary_lines(
                total_time_s, throughput, layout.workers_per_node, self.runtime.accelerator
            )
        )
        last = results[-1] if results else None
        self._log(
            "summary",
            total_time_s=total_time_s,
            throughput_images_per_s=throughput,
            images=images,
            epochs_run=len(results),
            first_epoch=results[0].epoch if results else None,
            last_epoch=last.epoch if last else None,
            total_epochs=self.cfg.total_epochs,
            nodes=layout.nodes,
            workers_per_node=list(layout.workers_per_node),
            world_size=self.env.world_size,
            final_val_loss=last.val_loss if last else None,
            final_val_accuracy=last.val_accuracy if last else None,
            early_stopped=self.early_stopped,
            seed=self.cfg.seed,
            torch_version=torch_version(),
            deterministic=self.cfg.deterministic,
        )

    def finished(self) -> bool:
        return self.early_stopped or self.epochs_completed >= self.cfg.total_epochs

    def run(self) -> int:
        """Resume if a snapshot exists, train the remaining epochs, report; returns the exit code."""
        layout = node_layout(self.env)
        resumed = self.restore()
        device_ids = [self.runtime.device.index] if self.runtime.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(self.model, device_ids=device_ids)
        self._announce(layout)
        if self.finished():
            self._say(
                f"Nothing to do: the snapshot has {self.epochs_completed} of "
                f"{self.cfg.total_epochs} epochs completed"
                + (" and stopped early" if self.early_stopped else "")
            )
            return EXIT_OK
        self.settle_buckets()
        inject_at = None if resumed else self.cfg.fail_at_epoch
        results: list[EpochResult] = []
        started = time.perf_counter()
        for epoch in range(self.epochs_completed, self.cfg.total_epochs):
            result = self.run_epoch(epoch, inject_failure=inject_at == epoch + 1)
            results.append(result)
            self.epochs_completed = epoch + 1
            stop = self.update_early_stop(result.val_accuracy)
            saved = self.save() if stop or self.cfg.snapshot_due(self.epochs_completed) else False
            self._report_epoch(result, saved)
            if stop:
                self._report_early_stop(result)
                break
        self._report_summary(layout, results, time.perf_counter() - started)
        dist.barrier()  # leave together: rank 0 may host the store the others still use
        return EXIT_OK


# ---------------------------------------------------------------------------- entry point


def _write_error_log(cfg: TrainConfig, env: DistEnv, exc: BaseException, epoch: int | None) -> None:
    if cfg.error_log is None:
        return
    path = Path(f"{cfg.error_log}.{env.rank}")
    text = (
        f"time: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\nrank: {env.rank}\nlocal_rank: {env.local_rank}\n"
        f"epoch: {epoch}\nerror: {type(exc).__name__}: {exc}\n\n"
        + "".join(traceback.format_exception(exc))
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as write_error:
        print(f"[rank {env.rank}] cannot write {path}: {write_error}", file=sys.stderr, flush=True)


def _record_failure(
    cfg: TrainConfig, env: DistEnv, exc: BaseException, trainer: Trainer | None
) -> None:
    epoch = trainer.epochs_completed + 1 if trainer is not None else None
    print(
        f"[rank {env.rank}] training failed in epoch {epoch}: {type(exc).__name__}: {exc}",
        file=sys.stderr,
        flush=True,
    )
    if not isinstance(exc, InjectedFailure):
        traceback.print_exception(exc, file=sys.stderr)
    _write_error_log(cfg, env, exc, epoch)
    if trainer is not None and trainer.metrics is not None:
        trainer.metrics.write(
            "failure",
            epoch=epoch,
            error=f"{type(exc).__name__}: {exc}",
            injected=isinstance(exc, InjectedFailure),
        )
    if isinstance(exc, InjectedFailure):
        # Every rank fails at the same step: wait until all have written their error logs,
        # so the launcher's tear-down cannot kill a rank before it wrote its file.
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001 - a peer already gone must not mask the failure
            pass


def _stack_dumps() -> None:
    """``kill -USR1 PID``, and a crash: every thread's stack to stderr (module docstring, "A
    hung job"). Left out where stderr is no file (the trainer called in-process, its output
    captured)."""
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        faulthandler.enable(all_threads=True)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        pass


def _exit_now(code: int) -> None:
    """Flush what the worker wrote and end the process with ``code`` without the
    interpreter's teardown (module docstring, "Exit")."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the trainer with command-line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _stack_dumps()
    try:
        cfg = config_from_args(args)
        env = DistEnv.from_environ()
    except (ValueError, DistributedSetupError) as exc:
        parser.print_usage(sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    trainer: Trainer | None = None
    if cfg.deterministic:
        enable_deterministic()  # before CUDA starts: cuBLAS reads its workspace setting then
    try:
        runtime = init_distributed(env)
        data = load_dataset(cfg.dataset, cfg.data_dir)
        trainer = Trainer(cfg, env, runtime, data)
        return trainer.run()
    except (
        DatasetError,
        SnapshotCorruptError,
        SnapshotMismatchError,
        DistributedSetupError,
    ) as exc:
        print(f"[rank {env.rank}] error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - any training error is reported the same way
        _record_failure(cfg, env, exc, trainer)
        return EXIT_FAILED
    finally:
        shutdown()


if __name__ == "__main__":
    _exit_now(main())
