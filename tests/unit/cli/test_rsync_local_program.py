"""Which local rsync ``workflow rsync`` uses (``rsync_copy.local_rsync``): none older than
3.4.0 (the release that fixed a malicious remote end reading or writing the client's files),
none when ``TRAINYARD_RSYNC`` is empty, the one it names otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.cli.rsync_copy import local_rsync


def _fake(tmp_path: Path, says: str) -> Path:
    program = tmp_path / "rsync"
    program.write_text(f"#!/bin/sh\necho '{says}'\n")
    program.chmod(0o755)
    return program


@pytest.mark.parametrize(
    ("says", "used"),
    [
        ("rsync  version 3.4.0  protocol version 32", True),
        ("rsync  version 3.5.0  protocol version 32", True),
        ("rsync  version 3.2.7  protocol version 31", False),
        ("rsync  version 3.3.9  protocol version 31", False),
        ("openrsync: protocol version 29", False),
    ],
)
def test_only_rsync_from_3_4_0_on_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, says: str, used: bool
) -> None:
    program = _fake(tmp_path, says)
    monkeypatch.setenv("TRAINYARD_RSYNC", str(program))
    assert local_rsync() == (str(program) if used else None)


def test_an_empty_setting_or_a_missing_program_means_no_rsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_RSYNC", "")
    assert local_rsync() is None
    monkeypatch.setenv("TRAINYARD_RSYNC", str(tmp_path / "none"))
    assert local_rsync() is None
