"""Container images on the local backend: which local *runtime* stands in for a task's image.

A task's ``image`` is recorded and mapped to a runtime: ``podman`` (the image itself as an OCI
container, ``backends.local.container``, where podman is installed), ``host`` (the host's own
tools; the default), ``busybox`` (a folder of busybox applet symlinks, as in a ``busybox`` or
``alpine`` image) or an absolute folder path. All but ``podman`` are folders put first on the
task's PATH, and the task log says the host's tools run instead (``image_note``). The pool's
``images`` map (``{pattern: runtime}``, fnmatch against the whole image and its bare name) is
asked first; then, when busybox is installed, ``busybox*`` and ``alpine*`` map to ``busybox``.
Details: docs/local-backend.md, "Images and runtimes".
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = [
    "DOCKER_HUB",
    "image_registry",
    "registry_host",
    "registry_credentials_for",
    "image_name",
    "runtime_for",
    "runtime_path",
    "busybox_applets",
    "DEFAULT_RUNTIMES",
    "image_note",
]

log = logging.getLogger("trainyard.backends.local")

DEFAULT_RUNTIMES = {"busybox*": "busybox", "alpine*": "busybox"}

_NSLOOKUP = """#!/bin/sh
# trainyard: nslookup for a task without DNS: IP addresses and /etc/hosts names first.
name=""
for arg in "$@"; do case "$arg" in -*) ;; *) [ -z "$name" ] && name="$arg" ;; esac; done
answer() {
  printf 'Server:\\t\\t127.0.0.1\\nAddress:\\t127.0.0.1:53\\n\\nName:\\t%s\\nAddress: %s\\n\\n' "$1" "$2"
  exit 0
}
case "$name" in
  ""|*[!0-9.]*) ;;
  *) answer "$name" "$name" ;;
esac
addr=$(BUSYBOX awk -v n="$name" '$1 !~ /^#/ { for (i = 2; i <= NF; i++) if ($i == n) { print $1; exit } }' /etc/hosts)
[ -n "$addr" ] && answer "$name" "$addr"
exec BUSYBOX nslookup "$@"
"""


DOCKER_HUB = "docker.io"
_DOCKER_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io", "registry.hub.docker.com")


def registry_host(registry: str) -> str:
    """A registry as ``host[:port]``, lower case, without a scheme, path or trailing slash;
    Docker Hub's other names are ``docker.io``."""
    text = registry.strip().lower()
    text = text.split("://", 1)[-1].split("/", 1)[0]
    return DOCKER_HUB if text in _DOCKER_HUB_ALIASES else text


def image_registry(image: str) -> str:
    """The registry an image reference pulls from (the Docker reference rule): its first
    path part when that has a ``.`` or a ``:`` or is ``localhost``, else Docker Hub
    (``docker.io``): ``nvcr.io/nvidia/pytorch:24.01`` -> ``nvcr.io``, ``ubuntu:22.04`` ->
    ``docker.io``, ``localhost:5000/x`` -> ``localhost:5000``."""
    first, slash, _rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return registry_host(first)
    return DOCKER_HUB


def registry_credentials_for(
    image: str | None, payloads: list[dict[str, str]]
) -> list[dict[str, str]]:
    """Those REGISTRY credential payloads (``registry``, ``username``, ``auth``) whose
    registry is ``image``'s (``image_registry``); none without an image."""
    if not image:
        return []
    wanted = image_registry(image)
    return [p for p in payloads if registry_host(p.get("registry") or DOCKER_HUB) == wanted]


def image_name(image: str) -> str:
    """The bare name of an image: no registry, no path, no tag or digest."""
    last = image.rsplit("/", 1)[-1]
    return last.split("@", 1)[0].split(":", 1)[0]


def _match(image: str, table: dict[str, str]) -> str | None:
    for pattern, runtime in table.items():
        if fnmatch.fnmatch(image, pattern) or fnmatch.fnmatch(image_name(image), pattern):
            return runtime
    return None


def runtime_for(image: str | None, images: dict[str, str]) -> str:
    """The runtime for ``image``: the pool's map, then the busybox defaults, else ``host``."""
    if not image:
        return "host"
    chosen = _match(image, images)
    if chosen is None and shutil.which("busybox"):
        chosen = _match(image, DEFAULT_RUNTIMES)
    return chosen or "host"


def busybox_applets(state_dir: Path) -> Path | None:
    """A folder of busybox applet symlinks (made once under ``state_dir``), or None if
    busybox is not installed."""
    busybox = shutil.which("busybox")
    if busybox is None:
        return None
    folder = state_dir / "runtimes" / "busybox"
    if (folder / "sh").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".busybox-", dir=folder.parent))
    _fill_applets(staging, os.path.realpath(busybox))
    try:
        staging.rename(folder)
    except OSError:  # another backend made it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _fill_applets(folder: Path, busybox: str) -> None:
    listing = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    for applet in listing.stdout.split():
        if "/" not in applet:
            (folder / applet).symlink_to(busybox)
    shim = folder / "nslookup"
    shim.unlink(missing_ok=True)
    shim.write_text(_NSLOOKUP.replace("BUSYBOX", busybox))
    shim.chmod(0o755)
    folder.chmod(0o755)


def runtime_path(runtime: str, state_dir: Path) -> list[str]:
    """The folders to put first on PATH for ``runtime`` (see module docstring)."""
    if runtime in ("host", "podman"):
        return []
    if runtime == "busybox":
        folder = busybox_applets(state_dir)
        if folder is None:
            log.warning(
                "image runtime busybox asked for but busybox is not installed; "
                "the host's tools run instead"
            )
            return []
        return [str(folder)]
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        return [runtime]
    log.warning(
        "unknown image runtime %r (expected host, podman, busybox or a folder); "
        "the host's tools run instead",
        runtime,
    )
    return []


def image_summary(image: str | None, runtime: str, why_no_podman: str | None = None) -> str:
    """What runs, in a few words for the task log's one-line header: ``image X``
    when podman runs it, else ``host tools`` and, given an image, why it is not run (the
    full words are ``image_note``'s, in the header's detail).

    >>> image_summary("ubuntu:22.04", "host")
    'host tools (image ubuntu:22.04 not run: no image runtime on this pool)'
    """
    if runtime == "podman" and why_no_podman is None:
        return f"image {image}" if image else "host tools"
    tools = "busybox tools" if runtime == "busybox" else "host tools"
    if not image:
        return tools
    if runtime == "podman":
        return f"{tools} (image {image} not run: podman cannot run it here)"
    if runtime == "host":
        return f"{tools} (image {image} not run: no image runtime on this pool)"
    return f"{tools} (image {image} not run: {runtime} tools instead)"


def image_note(image: str | None, runtime: str, why_no_podman: str | None = None) -> str:
    """One line for the task log: what runs in place of ``image`` ("" without an image or
    when podman runs it)."""
    if not image or (runtime == "podman" and why_no_podman is None):
        return ""
    if runtime == "podman":
        return f"image {image} is NOT run: {why_no_podman}; the host's tools run instead"
    if runtime == "host":
        return (
            f"image {image} is NOT run: this pool runs no images (images: podman in "
            "pools.yaml runs them); the host's tools run instead"
        )
    return f"image {image} is NOT run: the host's tools run instead, {runtime} first on PATH"
