"""The home is its owner's only (issue 11: ``$TRAINYARD_HOME`` created 0700; the store,
tokens, server.json, run.json and logs 0600), checked by stat after a real workflow in a
fresh home; and concurrent ``server add-user`` keep every token (issue 12, M5)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import httpx
from cli_e2e_support import TRAINYARD, Server, cli_env, processes_of, run_cli, wait_gone

ECHO = """
workflow:
  name: private
  tasks:
  - name: t
    command: [sh, -c, "echo hello > {{output}}/out.txt; echo done"]
"""


def test_home_and_its_files_are_private_after_a_real_workflow(tmp_path: Path) -> None:
    home = tmp_path / "fresh" / "home"  # does not exist yet: the CLI creates it
    spec = tmp_path / "echo.yaml"
    spec.write_text(ECHO)
    old = os.umask(0o022)  # what a user usually has; the CLI's processes inherit it
    try:
        done = run_cli(home, "workflow", "submit", str(spec), "--wait")
    finally:
        os.umask(old)
    try:
        assert done.code == 0, done.out + done.err
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        named = ["store.db", "tokens.json", "token", "server.json", "server.log", "task-token.key"]
        for name in named:
            if name == "store.db" and not (home / name).exists():
                continue  # the store has another name: covered by the walk below
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
        runs = list((home / "runs").rglob("run.json"))
        logs = list((home / "runs").rglob("task.log")) + list((home / "runs").rglob("events.jsonl"))
        assert runs and logs
        open_to_others = []
        for path in [home, *home.rglob("*")]:
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
                open_to_others.append(f"{path.relative_to(home)} {oct(st.st_mode)}")
        bad = [p for p in open_to_others if not _task_owned(p)]
        assert not bad, bad
        for path in [*runs, *logs]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    finally:
        run_cli(home, "server", "stop")
        for proc in wait_gone(processes_of(home), timeout_s=45):
            proc.kill()


def _task_owned(line: str) -> bool:
    """Files the task wrote itself (its output, its sandbox) keep the task's own umask
    (022, a container's usual one); they live in folders only the owner can enter."""
    return "/output/" in line or "/sandbox/" in line or "/input/" in line


def test_concurrent_add_user_keeps_every_token(server: Server) -> None:
    procs = [
        subprocess.Popen(
            [str(TRAINYARD), "server", "add-user", f"racer{i}"],
            env=cli_env(server.home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    tokens = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        tokens.append(out.strip())
    assert len(set(tokens)) == 6
    for token in tokens:
        answer = httpx.get(
            f"{server.url}/api/version", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        assert answer.status_code == 200, answer.text
    assert stat.S_IMODE((server.home / "tokens.json").stat().st_mode) == 0o600
