"""One class of refusal, one exit code, whichever side finds it (issue 24: "the same class
of refusal exits 2 in one place and 4 in another"). A bad argument value is a usage error,
exit 2, whether click, the CLI or the server finds it; a request the object's state forbids
is 4. Through the real CLI against the real server, as a user types them."""

from __future__ import annotations

import pytest
from cli_e2e_support import Server


@pytest.mark.parametrize(
    "args",
    [
        # found by the CLI itself (click or the verb's own check): 2 before and after
        ("workflow", "list", "--submitted-after", "tomorrow"),
        ("workflow", "list", "--status", "BOGUS"),
        ("pool", "list", "--mode", "bogus"),
        # found by the server: a token's expiry that is no date answered 400 -> exit 4
        ("token", "set", "exit-code-token", "--expires-at", "tomorrow"),
        # found by the CLI but raised as a configuration error: exit 4
        ("credential", "set", "c", "--type", "BOGUS", "--payload", "a=b"),
        ("credential", "set", "c", "--type", "GENERIC", "--payload", "novalue"),
        ("credential", "set", "c", "--type", "GENERIC", "--payload", "a=b", "--payload", "a=c"),
    ],
)
def test_a_bad_argument_value_exits_2_wherever_it_is_found(
    server: Server, args: tuple[str, ...]
) -> None:
    done = server.cli(*args)
    assert done.code == 2, (done.code, done.out, done.err)
    assert "Traceback" not in done.err
    assert done.err.strip(), "a refusal says why"


def test_an_unknown_object_exits_3_not_2_or_4(server: Server) -> None:
    for args in (
        ("workflow", "query", "no-such-workflow-1"),
        ("workflow", "restart", "no-such-workflow-1"),
    ):
        done = server.cli(*args)
        assert done.code == 3, (args, done.code, done.err)
