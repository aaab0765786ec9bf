"""Fixtures for training-kit tests (helpers live in training_support.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """The trainer sets torch's thread count for its process; give pytest's back afterwards."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
