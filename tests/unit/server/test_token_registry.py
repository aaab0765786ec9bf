"""``TokenRegistry`` writers in several processes at once keep every token (issue 12, M5:
a lost update of tokens.json), and task tokens (``trainyard.tasktokens``) are bound to
their workflow."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from trainyard import tasktokens
from trainyard.errors import AuthError
from trainyard.server.auth import TokenRegistry, User


def _adder(home: str, name: str, start: object, out: object) -> None:
    start.wait()  # type: ignore[attr-defined]
    tokens = [TokenRegistry(Path(home)).add(f"{name}-{i}") for i in range(15)]
    out.put(tokens)  # type: ignore[attr-defined]


def test_processes_adding_users_at_once_lose_no_token(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_adder, args=(str(tmp_path), f"u{i}", start, out)) for i in range(6)
    ]
    for proc in procs:
        proc.start()
    start.set()
    made = [t for _ in procs for t in out.get(timeout=120)]
    for proc in procs:
        proc.join(timeout=60)
    registry = TokenRegistry(tmp_path)
    assert len(made) == 90
    for token in made:
        assert registry.authenticate(token).name.startswith("u")


def test_a_task_token_acts_as_the_owner_of_its_workflow_only(tmp_path: Path) -> None:
    ended = {"w-done"}

    def owner(workflow_id: str) -> str:
        if workflow_id in ended:
            raise AuthError("the workflow ended")
        return "carol"

    registry = TokenRegistry(tmp_path, owner)
    token = tasktokens.task_token(tmp_path, "w-1.x")
    assert registry.authenticate(token) == User("carol", admin=False, workflow="w-1.x")
    assert tasktokens.token_workflow(tmp_path, token) == "w-1.x"
    forged = tasktokens.PREFIX + "w-2." + token.rsplit(".", 1)[1]
    for bad in (forged, token + "0", "tyt1.", "tyt1.w-1"):
        with pytest.raises(AuthError, match="unknown token"):
            registry.authenticate(bad)
    with pytest.raises(AuthError, match="ended"):
        registry.authenticate(tasktokens.task_token(tmp_path, "w-done"))
    assert oct((tmp_path / "task-token.key").stat().st_mode & 0o777) == "0o600"
