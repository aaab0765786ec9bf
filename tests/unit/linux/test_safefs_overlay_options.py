"""``mount_overlays`` gives overlayfs its upper and work folders (and an idmapped lower)
relative to the layer's folder: the kernel prints the options as given in every line of
``/proc/self/mountinfo`` showing the overlay, which bwrap reads once per bind (issue 11's
throughput). The mount still works from any working directory, which is restored.

Needs root (overlayfs, idmapped mounts); each mount runs in a thread of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.linux.test_safefs_image_layers import in_own_namespace
from trainyard.linux.safefs import mount_overlays
from trainyard.runfile import OverlayMount

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="overlayfs and idmapped mounts need root")


def options_of(target: str) -> str:
    with open("/proc/thread-self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.split()[4] == target:
                return line.split(" - ")[1].split()[2]
    raise AssertionError(f"{target} is not mounted")


@pytest.mark.parametrize("idmap", [None, 65534], ids=["plain", "idmapped"])
def test_the_overlays_options_name_its_folders_relative_to_the_layer(
    tmp_path: Path, idmap: int | None
) -> None:
    lower = tmp_path / "host"
    lower.mkdir()
    (lower / "file").write_text("host")
    base = tmp_path / "sandbox" / "overlay" / "layer"
    made = OverlayMount(
        lower=str(lower),
        upper=str(base / "upper"),
        work=str(base / "work"),
        target=str(base / "mnt"),
        idmap_uid=idmap,
        idmap_gid=idmap,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def look() -> tuple[str, str, str, int]:
        os.chdir(elsewhere)  # the thread's own working directory after the unshare too
        mount_overlays([made])
        Path(made.target, "new").write_text("task")
        return (
            options_of(made.target),
            os.getcwd(),
            Path(made.target, "file").read_text(),
            Path(made.target, "file").stat().st_uid,
        )

    cwd = os.getcwd()
    try:
        options, thread_cwd, text, uid = in_own_namespace(look)  # type: ignore[misc]
    finally:
        os.chdir(cwd)
    expected_lower = "lower" if idmap is not None else str(lower)
    assert f"lowerdir={expected_lower},upperdir=upper,workdir=work" in options
    assert str(tmp_path) not in options.replace(str(lower), "")
    assert (thread_cwd, text, uid) == (str(elsewhere), "host", idmap or 0)
    assert (base / "upper" / "new").read_text() == "task"
