"""$(VAR) expansion (Kubernetes rules) and private-root path rewriting."""

from __future__ import annotations

import pytest

from trainyard.runner.text import PathRewriter, expand_vars

ENV = {"FILE_PATH": "/tmp/run.sh", "N": "3"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(FILE_PATH)", "/tmp/run.sh"),
        ("a $(N) b $(N)", "a 3 b 3"),
        ("$$(FILE_PATH)", "$(FILE_PATH)"),
        ("$(UNKNOWN)", "$(UNKNOWN)"),
        ("echo $(cat /tmp/hello.txt)", "echo $(cat /tmp/hello.txt)"),
        ("$((1 + 2))", "$((1 + 2))"),
        ("$HOME and ${N}", "$HOME and ${N}"),
        ("cost $$5", "cost $5"),
        ("trailing $", "trailing $"),
        ("open $(N", "open $(N"),
    ],
)
def test_expand_vars_follows_kubernetes(text: str, expected: str) -> None:
    assert expand_vars(text, ENV) == expected


def test_rewriter_moves_whole_path_components_only() -> None:
    rw = PathRewriter("/r", ["/tmp", "/app"])
    assert rw.rewrite("sh /tmp/run.sh") == "sh /r/tmp/run.sh"
    assert rw.rewrite("cd /tmp && ls /app") == "cd /r/tmp && ls /r/app"
    assert rw.rewrite("x=/tmp:/app/y") == "x=/r/tmp:/r/app/y"
    assert rw.rewrite("'/tmp/a b'") == "'/r/tmp/a b'"
    assert rw.rewrite("/tmpx /var/tmp a/tmp ~/tmp") == "/tmpx /var/tmp a/tmp ~/tmp"


def test_rewriter_places_relative_and_absolute_paths_under_root() -> None:
    rw = PathRewriter("/r/", ["/tmp"])
    assert rw.place("/tmp/run.sh") == "/r/tmp/run.sh"
    assert rw.place("experiments/ckpt") == "/r/experiments/ckpt"
