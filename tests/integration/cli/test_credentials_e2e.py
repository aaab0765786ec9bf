"""Credentials end to end (issue 25): ``trainyard credential`` against a real server, a
spec naming one refused at submit and validate when the user lacks it (OSMO's words), and a
task in the local pool's sandbox getting them as OSMO gives them, while no value shows in
any answer, log, spec or file of the home."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from cli_e2e_support import Server, run_cli

SECRET = "hf_e2eSecretValue_8c1f"
OTHER = "ghp_pathFormSecret_77aa"

SPEC = """\
workflow:
  name: creds
  pool: osmo
  tasks:
  - name: use
    image: ubuntu:24.04
    command: [bash, -c]
    args:
    - |
      set -eu
      echo "env $(printf %s "$HF_TOKEN" | sha256sum | cut -c1-16)"
      echo "file $(sha256sum < /root/.gh/token | cut -c1-16)"
      echo "mode $(stat -c '%a' /root/.gh/token)"
      echo "keys $(ls /root/.gh | xargs)"
    credentials:
      hf: {HF_TOKEN: token}
      gh: /root/.gh
"""


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _grep_home(home: Path, needle: str) -> list[str]:
    done = subprocess.run(
        ["grep", "-rl", "--binary-files=text", needle, str(home)],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.split()


def test_set_list_delete_never_show_a_value(server: Server, tmp_path: Path) -> None:
    value_file = tmp_path / "token file"
    value_file.write_text("from-a-file-9d9d")
    done = server.cli(
        "credential", "set", "c1", "--type", "GENERIC", "--payload-file", f"token={value_file}"
    )
    assert done.code == 0, done.err
    listed = server.cli("credential", "list", "-t", "json").json()
    row = next(r for r in listed if r["name"] == "c1")
    assert (row["type"], row["keys"]) == ("GENERIC", ["token"])
    osmo_form = server.cli("credential", "--format-type", "json", "list")  # OSMO's place
    assert [r["name"] for r in osmo_form.json()] == [r["name"] for r in listed]
    table = server.cli("credential", "list")
    assert "c1" in table.out and "from-a-file" not in table.out + str(listed)
    bad = server.cli("credential", "set", "r1", "--type", "REGISTRY", "--payload", "registry=x")
    assert bad.code != 0 and "needs payload key(s) auth" in bad.err
    assert server.cli("credential", "delete", "c1").code == 0
    gone = server.cli("credential", "delete", "c1")
    assert gone.code == 3 and "Could not find the credential: c1" in gone.err


def test_a_missing_credential_is_refused_at_submit_and_validate(
    server: Server, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("hf:", "nope-token:"))
    before = server.ids()
    for verb in ("submit", "validate"):
        done = server.cli("workflow", verb, str(spec))
        assert done.code == 2, (verb, done.out, done.err)
        assert "Could not find the credential: nope-token" in done.err
    assert server.ids() == before


def test_a_sandboxed_task_gets_both_forms_and_no_value_leaks(
    server: Server, tmp_path: Path
) -> None:
    assert server.cli("credential", "set", "hf", "--payload", f"token={SECRET}").code == 0
    assert (
        server.cli(
            "credential", "set", "gh", "--type", "GENERIC", "--payload", f"token={OTHER}", "user=me"
        ).code
        == 0
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    workflow_id = server.submit(spec)
    data = server.wait(workflow_id)
    logs = server.logs(workflow_id)
    assert data["status"] == "COMPLETED", logs
    assert f"env {_digest(SECRET)}" in logs and f"file {_digest(OTHER)}" in logs
    assert "mode 600" in logs and "keys token user" in logs
    shown = "".join(
        [
            logs,
            str(server.query(workflow_id, verbose=True)),
            server.cli("workflow", "events", workflow_id).out,
            server.cli("workflow", "spec", workflow_id).out,
            run_cli(server.home, "workflow", "query", workflow_id).out,
        ]
    )
    assert SECRET not in shown and OTHER not in shown
    # Nothing of the home holds a value in clear: not the store, run.json, the task's
    # root (its files removed at the end), the server's log.
    assert _grep_home(server.home, SECRET) == []
    assert _grep_home(server.home, OTHER) == []
