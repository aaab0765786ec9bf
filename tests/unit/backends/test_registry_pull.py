"""Issue 25, REGISTRY credentials: which of a user's registry credentials an image's pull
uses, and what podman is handed (a fake ``podman`` that records its argv, environment and
auth file): the values only in a 0600 auth file, removed after the pull; never on argv."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from trainyard.backends.images import image_registry, registry_credentials_for
from trainyard.backends.local.image_pull import AUTH_FILE, auth_json, pull_image

SECRET = "regSecret_1d1d_value"
NVCR = {"registry": "nvcr.io", "username": "$oauthtoken", "auth": SECRET}
HUB = {"registry": "https://index.docker.io/v1/", "username": "me", "auth": "hubToken_2e2e"}


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io"),
        ("ubuntu:22.04", "docker.io"),
        ("library/ubuntu", "docker.io"),
        ("docker.io/library/alpine:3.18", "docker.io"),
        ("localhost:5000/x/y:1", "localhost:5000"),
        ("localhost/trainyard-test:1", "localhost"),
        ("Registry.Example.com:8443/a@sha256:" + "0" * 64, "registry.example.com:8443"),
    ],
)
def test_the_registry_of_an_image_follows_dockers_rule(image: str, registry: str) -> None:
    assert image_registry(image) == registry


def test_only_the_credentials_of_the_images_registry_are_taken() -> None:
    assert registry_credentials_for("nvcr.io/nvidia/pytorch:24.01", [HUB, NVCR]) == [NVCR]
    assert registry_credentials_for("ubuntu:22.04", [HUB, NVCR]) == [HUB]  # Docker Hub's names
    assert registry_credentials_for("ghcr.io/x/y", [HUB, NVCR]) == []
    assert registry_credentials_for(None, [HUB, NVCR]) == []


def test_auth_json_is_dockers_basic_auth_for_the_images_registry() -> None:
    doc = json.loads(auth_json("nvcr.io/nvidia/pytorch:24.01", [NVCR]))
    assert list(doc["auths"]) == ["nvcr.io"]
    assert base64.b64decode(doc["auths"]["nvcr.io"]["auth"]).decode() == f"$oauthtoken:{SECRET}"


FAKE = """#!/bin/sh
out="{out}"
printf '%s\\n' "$@" > "$out/argv"
env > "$out/env"
while [ $# -gt 0 ]; do
  if [ "$1" = --authfile ]; then cp "$2" "$out/auth.json"; stat -c %a "$2" > "$out/mode"; fi
  shift
done
[ {code} -eq 0 ] || echo "Error: initializing source: unauthorized: {secret} rejected" >&2
exit {code}
"""


def _fake_podman(tmp_path: Path, code: int = 0) -> tuple[Path, Path]:
    out = tmp_path / "seen"
    out.mkdir()
    script = tmp_path / "podman"
    script.write_text(FAKE.format(out=out, code=code, secret=SECRET))
    script.chmod(0o755)
    return script, out


def test_pull_hands_podman_a_0600_auth_file_it_then_removes(tmp_path: Path) -> None:
    podman, seen = _fake_podman(tmp_path)
    folder = tmp_path / "run"
    assert pull_image("nvcr.io/nvidia/pytorch:24.01", [NVCR], folder, podman=str(podman)) is None
    argv = (seen / "argv").read_text().split("\n")
    assert argv[:2] == ["pull", "--quiet"] and argv[-2] == "nvcr.io/nvidia/pytorch:24.01"
    assert f"--authfile\n{folder / AUTH_FILE}" in (seen / "argv").read_text()
    assert "--tls-verify=false" not in argv
    assert (seen / "mode").read_text().strip() == "600"
    assert json.loads((seen / "auth.json").read_text()) == json.loads(
        auth_json("nvcr.io/x", [NVCR])
    )
    for name in ("argv", "env"):
        assert SECRET not in (seen / name).read_text()
        assert (
            base64.b64encode(f"$oauthtoken:{SECRET}".encode()).decode()
            not in (seen / name).read_text()
        )
    assert not (folder / AUTH_FILE).exists()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_failed_pull_says_podmans_words_without_the_value_and_removes_the_file(
    tmp_path: Path,
) -> None:
    podman, _seen = _fake_podman(tmp_path, code=125)
    folder = tmp_path / "run"
    why = pull_image("localhost:5000/x:1", [NVCR], folder, podman=str(podman), tls_verify=False)
    assert why is not None and "unauthorized" in why and SECRET not in why
    assert "--tls-verify=false" in (_seen / "argv").read_text()
    assert not (folder / AUTH_FILE).exists()


def test_an_auth_file_left_as_a_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    podman, _seen = _fake_podman(tmp_path)
    folder = tmp_path / "run"
    folder.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (folder / AUTH_FILE).symlink_to(target)
    assert pull_image("nvcr.io/x:1", [NVCR], folder, podman=str(podman)) is None
    assert target.read_text() == "keep"
