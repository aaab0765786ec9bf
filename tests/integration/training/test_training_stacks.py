"""A hung job can be asked where it waits: SIGUSR1 makes a trainer print its stacks and go on.
A crashing one prints them as it dies. A finished one flushes its output and skips the
interpreter's teardown (``train._exit_now``)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from training_integration_support import wait_until


def trainer_argv(tmp_path: Path, epochs: int, *more: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainyard.training.train",
        "--total_epochs",
        str(epochs),
        "--snapshot_path",
        str(tmp_path / "snap") + "/",
        *more,
    ]


@contextlib.contextmanager
def training_past_its_first_epoch(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A trainer of 500 epochs, its output in ``stdout.txt`` and ``stderr.txt``, once its
    first epoch is done; killed at the end."""
    with open(tmp_path / "stdout.txt", "wb") as out, open(tmp_path / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(trainer_argv(tmp_path, 500), stdout=out, stderr=err)
    try:
        wait_until(
            lambda: "Epoch 1/500 completed" in (tmp_path / "stdout.txt").read_text(),
            120,
            "the first epoch",
        )
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_sigusr1_prints_every_threads_stack_and_training_goes_on(tmp_path: Path) -> None:
    log = tmp_path / "stderr.txt"
    with training_past_its_first_epoch(tmp_path) as proc:
        proc.send_signal(signal.SIGUSR1)
        text = wait_until(
            lambda: "Current thread" in log.read_text() and log.read_text(), 30, "the stack dump"
        )
        assert 'File "' in text and "train.py" in text, text
        epochs = (tmp_path / "stdout.txt").read_text().count("completed in")
        wait_until(
            lambda: (tmp_path / "stdout.txt").read_text().count("completed in") > epochs + 1,
            60,
            "more epochs after the dump",
        )
        assert proc.poll() is None, "the trainer stopped after the dump"


def test_a_crash_prints_every_threads_stack(tmp_path: Path) -> None:
    with training_past_its_first_epoch(tmp_path) as proc:
        proc.send_signal(signal.SIGABRT)  # what a C++ std::terminate in a library raises
        assert proc.wait(timeout=60) == -signal.SIGABRT
    text = (tmp_path / "stderr.txt").read_text()
    assert "Fatal Python error: Aborted" in text and "train.py" in text, text


def test_a_finished_worker_flushes_its_output_and_exits_with_its_code(tmp_path: Path) -> None:
    """Through a pipe, Python buffers its output: a worker that skips the interpreter's
    teardown must still hand all of it over."""
    done = subprocess.run(trainer_argv(tmp_path, 1), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("Training completed successfully."), done.stdout[-2000:]
    again = subprocess.run(
        trainer_argv(tmp_path, 1, "--batch_size", "0"), capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 2, again.stderr  # a usage error still ends with its own code
