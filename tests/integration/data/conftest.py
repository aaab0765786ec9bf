"""Fixtures for data tests against a real S3 API: moto's server on a free loopback port.

``moto_s3`` (one server for the session, bucket ``my-bucket``), ``s3_env`` (points
trainyard at it through the environment: ``TRAINYARD_S3_ENDPOINT_URL`` and the AWS_*
variables, fast retries, a private ``TRAINYARD_HOME``), ``prefix`` (a fresh key prefix) and
``proxy`` (a ``TcpProxy`` in front of the server, to cut or stop). Tests elsewhere can build the same
with ``trainyard.data.testing.MotoS3`` (see its module docstring).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from data_support import fast_retries

from trainyard.data.testing import MotoS3, TcpProxy

__all__ = ["moto_s3", "s3_env", "home", "prefix", "proxy"]


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server for the whole session, with ``my-bucket``."""
    with MotoS3(buckets=["my-bucket"]) as server:
        yield server


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``TRAINYARD_HOME`` and fast retries (0.01 s backoff, 3 attempts)."""
    path = tmp_path / "home"
    monkeypatch.setenv("TRAINYARD_HOME", str(path))
    monkeypatch.delenv("TRAINYARD_DATASET_URL", raising=False)
    fast_retries(monkeypatch)
    return path


@pytest.fixture
def s3_env(moto_s3: MotoS3, home: Path, monkeypatch: pytest.MonkeyPatch) -> MotoS3:
    """The environment pointed at ``moto_s3``; returns the server."""
    for key, value in moto_s3.env().items():
        monkeypatch.setenv(key, value)
    return moto_s3


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix in ``my-bucket`` (the server lives for the whole session)."""
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def proxy(moto_s3: MotoS3) -> Iterator[TcpProxy]:
    """A proxy in front of ``moto_s3`` that tests may cut or stop."""
    proxy = TcpProxy(moto_s3.port)
    yield proxy
    proxy.stop()
