"""Uploads never follow a symlink the task made out of the folder being uploaded (issue 11,
seen after the sandbox was rebuilt: the runner reads ``{{output}}`` from outside the sandbox,
so ``ln -s /etc/shadow {{output}}/x`` uploaded the host's file). A link to a file inside the
folder is uploaded under its own name with that file's content; a link that leads outside
(a host file, a host folder, ``..`` out of the folder) is skipped with a log line.

Through the real engine, the local backend and its bubblewrap sandbox, with a ``file://``
output URL and a dataset output.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

from trainyard.status import WorkflowStatus

SPEC = """
workflow:
  name: links
  tasks:
  - name: t
    environment:
      SECRET: "{{secret}}"
      SECRET_DIR: "{{secret_dir}}"
    command:
    - sh
    - -c
    - |
      set -e
      o="{{output}}"
      echo regular > "$o/regular.txt"
      ln -s regular.txt "$o/inner-link.txt"
      ln -s "$SECRET" "$o/leak-file"
      ln -s /etc/shadow "$o/shadow"
      ln -s "$SECRET_DIR" "$o/leak-dir"
      mkdir "$o/sub"
      ln -s ../../secret/key "$o/sub/up"
    outputs:
    - url: "file://{{dest}}/"
    - dataset:
        name: linkset-{{mark}}
"""


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineRun]:
    require_bwrap()
    monkeypatch.setenv("TRAINYARD_DATASET_URL", (tmp_path / "datasets").as_uri())
    home = tmp_path / "home dir"
    home.mkdir()
    made = EngineRun(home, allowed_data_roots=[str(tmp_path / "dest")])  # the file:// output
    yield made
    made.close()


def _stored_files(top: Path) -> dict[str, bytes]:
    """Every regular file below ``top`` (links are not followed, nor read)."""
    found: dict[str, bytes] = {}
    for folder, _dirs, names in os.walk(top):
        for name in names:
            path = Path(folder) / name
            if not path.is_symlink() and path.is_file():
                found[str(path.relative_to(top))] = path.read_bytes()
    return found


def test_uploads_never_follow_a_link_out_of_the_output_folder(
    run: EngineRun,
    tmp_path: Path,
) -> None:
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    secret = f"host-secret-{uuid.uuid4().hex}".encode()
    (secret_dir / "key").write_bytes(secret + b"\n")
    shadow = Path("/etc/shadow").read_bytes() if os.access("/etc/shadow", os.R_OK) else b""
    dest = tmp_path / "dest"
    mark = uuid.uuid4().hex[:8]

    wid = run.run(
        SPEC, secret=str(secret_dir / "key"), secret_dir=str(secret_dir), dest=str(dest), mark=mark
    )

    log = run.log(wid, "t")
    assert run.engine.state(wid).status is WorkflowStatus.COMPLETED, log
    uploaded = _stored_files(dest)
    assert uploaded == {"regular.txt": b"regular\n", "inner-link.txt": b"regular\n"}, log
    stored = {**_stored_files(run.home), **_stored_files(tmp_path / "datasets")}
    datasets = _stored_files(tmp_path / "datasets" / f"linkset-{mark}")
    assert sorted(datasets.values()).count(b"regular\n") == 2, (sorted(datasets), log)
    for content in [*stored.values(), *uploaded.values()]:
        assert secret not in content
        assert not shadow or shadow.strip() not in content
    for name in ("leak-file", "shadow", "leak-dir", "sub/up"):
        assert f"{name}: a symlink" in log, log
