"""What a task's image brings to its container (podman's local storage, never a registry):
its layers, ``ENV`` and ``USER`` (``inspect_image``), the container's own writable root made
of those layers (``root_overlay``) and the ids its ``USER`` gets (``task_id_bases``).
Where this root is mounted and removed: ``container.rootfs_path``.
Design: docs/local-backend.md, "Containers (podman)".
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.backends.local.container import ROOT_OWNED, TASK_HOST_ID, ContainerPlan
from trainyard.linux.safefs import MAPPED_OTHER_IDS
from trainyard.runfile import OverlayMount

__all__ = [
    "ImageInfo",
    "image_info",
    "inspect_image",
    "image_present",
    "why_no_own_root",
    "root_overlay",
    "prepare_rootfs",
    "root_note",
    "image_links",
    "ID_RANGE_OWNER",
    "task_id_bases",
    "user_ids",
    "user_host_ids",
    "user_note",
]

_QUERY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ImageInfo:
    """What ``inspect_image`` found of a local image.

    Attributes:
        id: podman's image id.
        layers: its layer folders in podman's storage, top first; empty unless podman's
            storage driver is ``overlay``.
        env: its ``ENV``, as ``NAME=VALUE``.
        user: its ``USER`` (``""``: root).
    """

    id: str
    layers: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    user: str = ""

    @property
    def runs_as_root(self) -> bool:
        """Whether its ``USER`` is root (user and group ``""``, ``root`` or ``0``): the only
        id a container's user namespace maps here (``container._privilege_args``)."""
        return all(part in ("", "root", "0") for part in self.user.split(":", 1))


def image_info(doc: dict[str, Any]) -> ImageInfo:
    """An ``ImageInfo`` from one object of ``podman image inspect``'s JSON."""
    driver = doc.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    layers: tuple[str, ...] = ()
    if driver.get("Name") == "overlay" and data.get("UpperDir"):
        below = [p for p in str(data.get("LowerDir") or "").split(":") if p]
        layers = (str(data["UpperDir"]), *below)
    config = doc.get("Config") or {}
    env = tuple(str(v) for v in config.get("Env") or ())
    user = str(config.get("User") or doc.get("User") or "")
    return ImageInfo(id=str(doc.get("Id", "")), layers=layers, env=env, user=user)


def inspect_image(image: str, podman: str = "podman") -> ImageInfo | None:
    """``image`` as podman's local storage has it (``podman image inspect``; never pulls),
    or None when it is not there (or podman cannot say)."""
    try:
        done = subprocess.run(
            [podman, "image", "inspect", image],
            capture_output=True,
            text=True,
            timeout=_QUERY_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        return image_info(json.loads(done.stdout)[0])
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        return None


def image_present(image: str, podman: str = "podman") -> bool:
    """Whether ``image`` is in podman's local storage (``podman image exists``; never pulls)."""
    try:
        done = subprocess.run(
            [podman, "image", "exists", image], capture_output=True, timeout=_QUERY_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def why_no_own_root(info: ImageInfo, overlay_ok: bool) -> str | None:
    """None when an image task can get a root of its own (``root_overlay``), else why not.

    Args:
        info: the image (``inspect_image``).
        overlay_ok: whether the runner can mount overlayfs here (``sandbox.overlay_supported``).
    """
    if not overlay_ok:
        return "the runner cannot mount overlayfs here (needs root)"
    if not info.layers:
        return "podman's storage driver is not overlay, so its layers cannot be stacked"
    return None


def root_overlay(plan: ContainerPlan, info: ImageInfo, layer_dir: Path) -> OverlayMount:
    """The container's own root for the runner to mount at ``plan.rootfs``: the image's
    layers, idmapped, under ``layer_dir/upper`` (docs/local-backend.md, "Containers (podman)")."""
    assert plan.rootfs is not None and info.layers
    return OverlayMount(
        lower=info.layers[0],
        lower_below=list(info.layers[1:]),
        upper=str(layer_dir / "upper"),
        work=str(layer_dir / "work"),
        target=str(plan.rootfs),
        idmap_uid=TASK_HOST_ID,
        idmap_gid=TASK_HOST_ID,
        nodev=True,
        idmap_uid_base=plan.id_bases[0] if plan.id_bases else None,
        idmap_gid_base=plan.id_bases[1] if plan.id_bases else None,
    )


def prepare_rootfs(plan: ContainerPlan, layer: OverlayMount) -> None:
    """Make ``container.ROOTFS_PARENT`` (0711: the container's root passes, nobody lists
    it) and the upper folder (0755: the mode of the container's ``/``). Raises OSError."""
    assert plan.rootfs is not None
    for folder in (plan.rootfs.parent.parent, plan.rootfs.parent):
        folder.mkdir(mode=0o711, parents=True, exist_ok=True)
        folder.chmod(0o711)
    upper = Path(layer.upper)
    upper.mkdir(mode=0o755, parents=True, exist_ok=True)
    upper.chmod(0o755)


def root_note(why_not: str | None) -> str:
    """The task log's line on the container's root (``why_no_own_root``)."""
    if why_not is None:
        return (
            "container root: its own writable root (the image's layers under a layer of "
            "this attempt's: RESTART keeps it, RESCHEDULE starts afresh)"
        )
    return f"container root: podman's container layer, which RESTART does NOT keep ({why_not})"


def image_links(info: ImageInfo, names: Iterable[str] = ROOT_OWNED) -> set[str]:
    """Which top-level ``names`` the image has as symlinks (``/tmp -> /var/tmp``): as the
    top-most layer holding the name has it."""
    found = set()
    for name in names:
        for layer in info.layers:
            path = os.path.join(layer, name)
            if os.path.lexists(path):
                if os.path.islink(path):
                    found.add(name)
                break
    return found


ID_RANGE_OWNER = "trainyard"
"""The ``/etc/subuid`` and ``/etc/subgid`` entry (``trainyard:START:COUNT``, COUNT at least
65535) whose host ids a container's ids 1..65535 are, where it has its own root."""
SUBUID, SUBGID = Path("/etc/subuid"), Path("/etc/subgid")


def _range_start(path: Path, owner: str) -> int | None:
    """START of the first ``owner:START:COUNT`` line of ``path`` with COUNT >= 65535 and
    START above the ids a container's root may be (65535), else None."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] == owner and parts[1].isdigit() and parts[2].isdigit():
            start, count = int(parts[1]), int(parts[2])
            if count >= MAPPED_OTHER_IDS and start > MAPPED_OTHER_IDS:
                return start
    return None


def task_id_bases(
    subuid: Path = SUBUID, subgid: Path = SUBGID, owner: str = ID_RANGE_OWNER
) -> tuple[int, int] | None:
    """The host uid and gid of a container's id 1 (``ID_RANGE_OWNER``'s ranges), or None
    where the host lends no such range (then only the container's root is mapped)."""
    uid, gid = _range_start(subuid, owner), _range_start(subgid, owner)
    return None if uid is None or gid is None else (uid, gid)


def _image_file(info: ImageInfo, relative: str) -> str:
    """The text of the file ``relative`` in the image (its top-most layer that has the
    name; a link or anything but a regular file there: ""), or ""."""
    for layer in info.layers:
        path = os.path.join(layer, relative)
        if os.path.lexists(path):
            if os.path.islink(path) or not os.path.isfile(path):
                return ""
            try:
                return Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                return ""
    return ""


def _lookup(text: str, name: str, field_index: int) -> int | None:
    """Field ``field_index`` of the ``/etc/passwd``-like line whose first field is ``name``."""
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) > field_index and fields[0] == name and fields[field_index].isdigit():
            return int(fields[field_index])
    return None


def user_ids(info: ImageInfo) -> tuple[int, int] | None:
    """The image's ``USER`` as (uid, gid) inside the container: numbers as given, names
    from its ``/etc/passwd`` and ``/etc/group``; without a group, a name's passwd group,
    and 0 for a number (as podman, for an id its ``/etc/passwd`` does not list). None when
    a name is not found or an id is above 65535 (not mapped)."""
    user, _, group = info.user.partition(":")
    passwd = "" if user.isdigit() else _image_file(info, "etc/passwd")
    uid = int(user) if user.isdigit() else _lookup(passwd, user, 2)
    if group.isdigit():
        gid: int | None = int(group)
    elif group:
        gid = _lookup(_image_file(info, "etc/group"), group, 2)
    else:
        gid = 0 if user.isdigit() else _lookup(passwd, user, 3)
    if uid is None or gid is None or max(uid, gid) > MAPPED_OTHER_IDS:
        return None
    return uid, gid


def user_host_ids(ids: tuple[int, int], bases: tuple[int, int]) -> tuple[int, int]:
    """The host uid and gid of the container's ``ids`` (0: ``TASK_HOST_ID``)."""
    return tuple(
        TASK_HOST_ID if i == 0 else base + i - 1  # type: ignore[return-value]
        for i, base in zip(ids, bases, strict=True)
    )


def user_note(
    image: str, info: ImageInfo, own_root: bool, mapped: bool = False
) -> tuple[str, str | None]:
    """What becomes of an image whose ``USER`` is not root: with ``mapped`` (its own root
    and ``task_id_bases``) it runs as that user, nothing to say; else only uid 0 is mapped:
    with its own root the command runs as root anyway (a line for the task log); with
    podman's container layer it cannot start (a start error). ``("", None)`` for a root
    image.

    Returns:
        (a line for the task log, or ""; a start error, or None).
    """
    if info.runs_as_root or mapped:
        return "", None
    if own_root:
        return (
            f"image USER {info.user!r} is not used: the command runs as root inside (uid "
            f"0, the host's nobody, is the only id mapped: no {ID_RANGE_OWNER} range in "
            f"{SUBUID} and {SUBGID}, or the user is not found in the image)"
        ), None
    return "", (
        f"image {image!r} runs as USER {info.user!r}, but uid 0 is the only id mapped "
        "in its container here and, without a root of its own, podman would start it "
        "as that user: use an image that runs as root, or a pool whose server runs as "
        "root with podman's overlay storage (docs/security.md, Images)"
    )
