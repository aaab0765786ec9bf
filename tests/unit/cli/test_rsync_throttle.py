"""OSMO's ``workflow rsync upload --upload-rate-limit``: the archive stream is held to it."""

from __future__ import annotations

import io
import time

from trainyard.cli.rsync_copy import Throttled as _Throttled


def test_an_upload_stream_keeps_to_its_rate_and_loses_nothing() -> None:
    sink = io.BytesIO()
    throttled = _Throttled(sink, rate_bytes_per_s=1_000_000)
    data = bytes(range(256)) * 1000  # 256,000 bytes: at least 0.256 s at 1 MB/s
    started = time.monotonic()
    for start in range(0, len(data), 10_000):
        assert throttled.write(data[start : start + 10_000]) == len(data[start : start + 10_000])
    assert time.monotonic() - started >= 0.25
    assert sink.getvalue() == data


def test_a_fast_enough_rate_adds_no_wait() -> None:
    throttled = _Throttled(io.BytesIO(), rate_bytes_per_s=10**12)
    started = time.monotonic()
    throttled.write(b"x" * 100_000)
    assert time.monotonic() - started < 0.2
