"""Image -> local runtime, and the busybox applet folder (its nslookup shim included)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trainyard.backends.images import busybox_applets, image_name, runtime_for, runtime_path


@pytest.mark.parametrize(
    ("image", "name"),
    [
        ("busybox", "busybox"),
        ("alpine:3.18", "alpine"),
        ("docker.io/library/alpine:3.18", "alpine"),
        ("nvcr.io/nvidia/pytorch:24.03-py3", "pytorch"),
        ("localhost:5000/tools/busybox@sha256:abc", "busybox"),
    ],
)
def test_image_name(image: str, name: str) -> None:
    assert image_name(image) == name


def test_pool_map_wins_then_defaults_then_host(tmp_path: Path) -> None:
    assert runtime_for("ubuntu:22.04", {"ubuntu*": str(tmp_path)}) == str(tmp_path)
    assert runtime_for("alpine:3.18", {"alpine*": "host"}) == "host"
    assert runtime_for("ubuntu:22.04", {}) == "host"
    assert runtime_for(None, {}) == "host"
    expected = "busybox" if shutil.which("busybox") else "host"
    assert runtime_for("busybox", {}) == expected
    assert runtime_for("docker.io/library/alpine:3.18", {}) == expected
    assert runtime_path("host", tmp_path) == []
    assert runtime_path(str(tmp_path), tmp_path) == [str(tmp_path)]


@pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox not installed")
def test_busybox_applets_and_nslookup_shim(tmp_path: Path) -> None:
    folder = busybox_applets(tmp_path)
    assert folder is not None and busybox_applets(tmp_path) == folder
    assert (folder / "sh").exists() and (folder / "nc").exists()
    done = subprocess.run(
        [str(folder / "nslookup"), "127.4.5.6"], capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0 and "Address: 127.4.5.6" in done.stdout
    done = subprocess.run(
        [str(folder / "nslookup"), "localhost"], capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0 and "Address: 127.0.0.1" in done.stdout
