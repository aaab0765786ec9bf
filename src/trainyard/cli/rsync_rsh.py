"""rsync's remote shell for ``workflow rsync``: ``python -m trainyard.cli.rsync_rsh HOST
COMMAND...`` runs COMMAND in the task whose server ``entry`` (JSON) is in
``$TRAINYARD_RSYNC_ENTRY``, through the same host command as ``workflow exec``
(``task_entry.command_argv``); HOST, which rsync puts first, is ignored."""

from __future__ import annotations

import json
import os
import sys

from trainyard.cli.task_entry import command_argv, command_env

__all__ = ["ENTRY_ENV", "main"]

ENTRY_ENV = "TRAINYARD_RSYNC_ENTRY"


def main(argv: list[str]) -> int:
    """Replace this process with COMMAND run in the task. Returns 2 on a bad call (no entry,
    no command); otherwise does not return (``os.execvpe``; raises OSError if it fails)."""
    entry_text = os.environ.pop(ENTRY_ENV, "")
    if not entry_text or len(argv) < 2:
        print(f"rsync_rsh: needs ${ENTRY_ENV} and HOST COMMAND...", file=sys.stderr)
        return 2
    entry = json.loads(entry_text)
    command = command_argv(entry, argv[1:], False, byte_stream=True)
    os.execvpe(command[0], command, command_env(entry) or dict(os.environ))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
