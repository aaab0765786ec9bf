"""Issue 25, REGISTRY credentials on a podman pool: a task's image that podman does not have
is pulled from its registry with the submitter's registry credential, as OSMO pulls with
the owner's registry credentials.

The registry is real enough for podman: a small HTTP server speaking the registry v2 API
(``/v2/``, manifests, blobs) with HTTP Basic auth (401 and a ``WWW-Authenticate`` challenge
until podman sends the credential), serving the tests' busybox image as ``podman save
--format oci-dir`` wrote it. Nothing of the credential may then be found in the home (logs,
run.json, events, the store: the payload is stored encrypted) nor on podman's command line.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from engine_run import EngineRun, require_bwrap
from local_support import busybox_image

from trainyard.backends.local.container import probe_podman
from trainyard.backends.local.container_image import image_present
from trainyard.status import Status

USER = "puller"
SECRET = "regSecret_8c8c_value"
NAME = "trainyard-registry-test"

pytestmark = pytest.mark.skipif(probe_podman() is not None, reason=f"{probe_podman()}")


class _Registry(ThreadingHTTPServer):
    layout: Path
    seen_auth: list[str]


class _Handler(BaseHTTPRequestHandler):
    server: _Registry

    def log_message(self, *_args: object) -> None:
        pass

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        self.server.seen_auth.append(header)
        good = "Basic " + base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
        if header == good:
            return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="trainyard-test"')
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def _send(self, body: bytes, kind: str, digest: str | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def _blob(self, digest: str) -> bytes | None:
        path = self.server.layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
        return path.read_bytes() if digest.startswith("sha256:") and path.is_file() else None

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self._authorized():
            return
        if self.path.rstrip("/") == "/v2":
            self._send(b"{}", "application/json")
            return
        parts = self.path.split("/")
        if len(parts) == 5 and parts[2] == NAME and parts[3] in ("manifests", "blobs"):
            index = json.loads((self.server.layout / "index.json").read_text())
            manifest = index["manifests"][0]
            digest = manifest["digest"] if parts[3] == "manifests" else parts[4]
            body = self._blob(digest)
            if body is not None:
                kind = (
                    manifest["mediaType"] if parts[3] == "manifests" else "application/octet-stream"
                )
                self._send(body, kind, digest)
                return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[_Registry]:
    require_bwrap()
    source = busybox_image(tmp_path)
    layout = tmp_path / "oci"
    done = subprocess.run(
        ["podman", "save", "--format", "oci-dir", "-o", str(layout), source],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    server = _Registry(("127.0.0.1", 0), _Handler)
    server.layout, server.seen_auth = layout, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _grep(folder: Path, needle: str) -> list[str]:
    done = subprocess.run(
        ["grep", "-rl", "--binary-files=text", needle, str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.split()


SPEC = """\
workflow:
  name: private-image
  tasks:
  - name: t
    image: {image}
    command: [sh, -c, "echo pulled-and-ran"]
"""


def test_a_missing_image_is_pulled_with_the_submitters_registry_credential(
    registry: _Registry, tmp_path: Path
) -> None:
    port = registry.server_address[1]
    image = f"localhost:{port}/{NAME}:1"
    assert not image_present(image)
    (tmp_path / "home").mkdir()
    run = EngineRun(
        tmp_path / "home", images={"*": "podman"}, insecure_registries=[f"localhost:{port}"]
    )
    try:
        run.engine.credentials.set(
            "tester",
            "my-registry",
            "REGISTRY",
            {"registry": f"localhost:{port}", "username": USER, "auth": SECRET},
        )
        wid = run.run(SPEC.format(image=image))
        task = run.engine.state(wid).tasks["t"]
        log = run.log(wid, "t")
        assert task.status is Status.COMPLETED, (task, log)
        assert "pulled-and-ran" in log
        good = "Basic " + base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
        assert good in registry.seen_auth  # podman sent the credential it was handed
        home = tmp_path / "home"
        assert _grep(home, SECRET) == [] and _grep(home, good.split()[1]) == []
        assert list(home.rglob("registry-auth.json")) == []
    finally:
        run.close()
        subprocess.run(["podman", "rmi", "--force", image], capture_output=True, timeout=120)


def test_a_pull_the_registry_refuses_is_failed_image_pull_naming_the_image(
    registry: _Registry, tmp_path: Path
) -> None:
    port = registry.server_address[1]
    image = f"localhost:{port}/{NAME}:1"
    (tmp_path / "home").mkdir()
    run = EngineRun(
        tmp_path / "home", images={"*": "podman"}, insecure_registries=[f"localhost:{port}"]
    )
    try:
        run.engine.credentials.set(
            "tester",
            "wrong",
            "REGISTRY",
            {"registry": f"localhost:{port}", "username": USER, "auth": "not-the-secret"},
        )
        wid = run.run(SPEC.format(image=image))
        task = run.engine.state(wid).tasks["t"]
        assert task.status is Status.FAILED_IMAGE_PULL, (task, run.log(wid, "t"))
        assert image in (task.failure_reason or "")
        assert "could not be pulled with your registry credential" in run.log(wid, "t")
        assert "not-the-secret" not in run.log(wid, "t")
    finally:
        run.close()
        subprocess.run(["podman", "rmi", "--force", image], capture_output=True, timeout=120)
