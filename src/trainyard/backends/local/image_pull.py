"""An image missing from podman's local storage, pulled at a task's start only with the
submitter's REGISTRY credential for the image's registry (``pull_image``: an auth file of the
attempt's, 0600, removed after the pull; no value on a command line or in a log), else the
task fails with FAILED_IMAGE_PULL (``missing_image_message``, ``pull_failed_message``).
Design: docs/local-backend.md, "Containers (podman)".
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from trainyard.backends.images import image_registry

__all__ = [
    "AUTH_FILE",
    "PULL_TIMEOUT_S",
    "auth_json",
    "pull_image",
    "pull_failed_message",
    "missing_image_message",
]


AUTH_FILE = "registry-auth.json"
"""The auth file of a pull (``pull_image``), in the attempt's run folder, for the pull only."""
PULL_TIMEOUT_S = 600.0
"""The longest a pull may take before the task fails at start (FAILED_IMAGE_PULL)."""


def _basic(payload: dict[str, str]) -> str:
    """docker's ``auth`` value, base64 of ``user:password``: OSMO's ``username`` and
    ``auth`` (the password or token); without ``username``, ``auth`` is taken as that value
    already (as in a docker ``config.json``)."""
    import base64

    if payload.get("username"):
        return base64.b64encode(f"{payload['username']}:{payload['auth']}".encode()).decode()
    return payload["auth"]


def auth_json(image: str, payloads: list[dict[str, str]]) -> str:
    """The ``containers-auth.json`` (``{"auths": {REGISTRY: {"auth": ...}}}``) that gives
    podman the first of ``payloads`` for ``image``'s registry (``images.image_registry``).

    Raises:
        ValueError: ``payloads`` is empty.
    """
    if not payloads:
        raise ValueError("no registry credential")
    return json.dumps({"auths": {image_registry(image): {"auth": _basic(payloads[0])}}})


def _write_auth(folder: Path, text: str) -> Path:
    """``folder/AUTH_FILE``, created 0600 (an old one removed first: never followed)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / AUTH_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return path


def _masked(text: str, payloads: list[dict[str, str]]) -> str:
    for payload in payloads:
        for value in (payload.get("auth", ""), _basic(payload) if payload.get("auth") else ""):
            if len(value) >= 4:
                text = text.replace(value, "***")
    return text


def pull_image(
    image: str,
    payloads: list[dict[str, str]],
    folder: Path,
    *,
    podman: str = "podman",
    tls_verify: bool = True,
    timeout_s: float = PULL_TIMEOUT_S,
) -> str | None:
    """Pull ``image`` with the first of ``payloads`` (REGISTRY credentials for its
    registry): ``podman pull --authfile folder/AUTH_FILE IMAGE``, the file 0600 and removed
    when the pull ends, whatever its outcome (the values never on podman's command line,
    which every user of the machine can read, nor in its environment).

    Args:
        folder: the attempt's private run folder (made 0700 if need be).
        tls_verify: False for a registry of the pool's ``insecure_registries`` (plain
            HTTP or an unverified certificate: podman's ``--tls-verify=false``).
        timeout_s: the longest the pull may take, seconds.

    Returns:
        None when pulled, else why not: one line, podman's own words, with no credential
        value in it.
    """
    path = _write_auth(folder, auth_json(image, payloads))
    argv = [podman, "pull", "--quiet", "--authfile", str(path)]
    argv += [] if tls_verify else ["--tls-verify=false"]
    try:
        done = subprocess.run(
            [*argv, image],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"podman pull took more than {timeout_s:g} s"
    except OSError as exc:
        return f"podman pull could not run: {exc.strerror}"
    finally:
        path.unlink(missing_ok=True)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return _masked(last, payloads)


def pull_failed_message(image: str, why: str) -> str:
    """The task log's line for an image that a pull with the submitter's registry
    credential could not fetch."""
    return (
        f"image {image!r} could not be pulled with your registry credential for "
        f"{image_registry(image)}: {why}; check the image's name and the credential "
        f"(trainyard credential list), then restart the workflow"
    )


def missing_image_message(image: str) -> str:
    """The task log's line for an image that is not present locally."""
    return (
        f"image {image!r} is not present in podman's local storage and is pulled here "
        f"only with a registry credential of yours for {image_registry(image)} (trainyard "
        f"credential set NAME --type REGISTRY --payload registry={image_registry(image)} "
        f"username=USER auth=TOKEN), or build or load it first (podman build, podman "
        f"load), then restart the workflow"
    )
