"""``mount_overlays`` of a layer with ``lower_below`` (a container image's layers: issue 11,
an image task's writable root that RESTART keeps): every layer stacked, top first, each
attached idmapped (the host's root seen as the task's uid), writes in the upper folder only,
and many layers under long paths still fit overlayfs' one page of options.

Needs root (overlayfs, idmapped mounts); each check runs in a thread of its own, whose
private mount namespace goes away with it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from trainyard.linux.safefs import mount_overlays
from trainyard.runfile import OverlayMount

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="overlayfs and idmapped mounts need root")


def in_own_namespace(work: Callable[[], object]) -> object:
    """Run ``work`` in a thread (its mount namespace is its own); return or raise its result."""
    result: dict[str, object] = {}

    def body() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # handed to the caller
            result["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(60)
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result.get("value")


def layer(base: Path, lowers: list[Path], idmap: int | None = 65534) -> OverlayMount:
    return OverlayMount(
        lower=str(lowers[0]),
        lower_below=[str(p) for p in lowers[1:]],
        upper=str(base / "upper"),
        work=str(base / "work"),
        target=str(base / "root"),
        idmap_uid=idmap,
        idmap_gid=idmap,
    )


def test_image_layers_are_stacked_top_first_and_idmapped(tmp_path: Path) -> None:
    top, middle, bottom = (tmp_path / "layers" / n for n in ("top", "middle", "bottom"))
    for folder, text in ((top, "top"), (middle, "middle"), (bottom, "bottom")):
        (folder / "etc").mkdir(parents=True)
        (folder / "etc" / "which").write_text(text)
        (folder / f"only-{folder.name}").write_text(folder.name)
    base = tmp_path / "sandbox" / "overlay" / "image"
    made = layer(base, [top, middle, bottom])

    def look() -> tuple[str, list[str], int, int]:
        mount_overlays([made])
        root = Path(made.target)
        (root / "etc" / "which").write_text("written")
        seen = sorted(p.name for p in root.iterdir())
        return (
            seen and (root / "only-bottom").read_text(),
            seen,
            (root / "only-top").stat().st_uid,
            (root / "etc").stat().st_gid,
        )

    bottom_text, seen, uid, gid = in_own_namespace(look)  # type: ignore[misc]
    assert bottom_text == "bottom" and seen == ["etc", "only-bottom", "only-middle", "only-top"]
    assert (uid, gid) == (65534, 65534)  # the host's root files are the task's
    assert (base / "upper" / "etc" / "which").read_text() == "written"  # the write landed here
    assert (top / "etc" / "which").read_text() == "top"  # never in a layer
    assert not any(Path(made.target).iterdir())  # the host sees no mount


def test_many_layers_under_long_paths_fit_in_the_mount_options(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120) / ("e" * 120)
    lowers = []
    for index in range(60):  # 60 x ~260 characters: far more than a page if given whole
        folder = deep / f"layer-{index:03d}-{'x' * 20}"
        folder.mkdir(parents=True)
        (folder / f"f{index}").write_text(str(index))
        lowers.append(folder)
    made = layer(deep / "image", lowers)

    def count() -> tuple[int, bool]:
        before = os.getcwd()
        mount_overlays([made])
        return len(list(Path(made.target).iterdir())), os.getcwd() == before

    assert in_own_namespace(count) == (60, True)  # the thread's folder is back as it was
