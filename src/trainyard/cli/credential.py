"""``trainyard credential set|list|delete``: the caller's named secrets, as OSMO's
``osmo credential`` (types REGISTRY, DATA, GENERIC; ``store.credentials``).

A value never comes back: ``list`` shows names, types and key names only. Values given with
``--payload KEY=VALUE`` are visible in the shell's history and the process table; prefer
``--payload-file KEY=PATH`` for real secrets.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, console, emit, table
from trainyard.errors import BadArgumentError

if TYPE_CHECKING:
    from trainyard.server.answers import CredentialAnswer, DeletedAnswer

__all__ = ["app", "parse_payload"]

app = typer.Typer(
    no_args_is_help=True, help="Credentials (secrets) that tasks use: `credentials:` in a spec."
)

TYPES = ("REGISTRY", "DATA", "GENERIC")


@app.callback()
def _group(
    ctx: typer.Context,
    fmt: Format | None = typer.Option(
        None,
        "--format-type",
        help="json or table, for every subcommand (OSMO puts it "
        "before the subcommand: `credential --format-type json list`).",
    ),
) -> None:
    """Credentials (secrets) that tasks use: `credentials:` in a spec."""
    ctx.obj = fmt


def _format(ctx: typer.Context, fmt: Format) -> Format:
    """The subcommand's format, or the group's ``--format-type`` when given."""
    return ctx.obj if isinstance(ctx.obj, Format) else fmt


def _pair(flag: str, item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise BadArgumentError(f"{flag} {item.split('=')[0]!r}...: give KEY=VALUE")
    return key, value


def parse_payload(pairs: list[str], files: list[str]) -> dict[str, str]:
    """``--payload KEY=VALUE`` and ``--payload-file KEY=PATH`` (the file's contents) as one
    payload.

    Raises:
        BadArgumentError: a pair without ``=``, a key given twice, or a file that cannot be read
            (its path named, never a value).
    """
    payload: dict[str, str] = {}
    for flag, items in (("--payload", pairs), ("--payload-file", files)):
        for item in items:
            key, value = _pair(flag, item)
            if key in payload:
                raise BadArgumentError(f"{flag}: key {key!r} given twice")
            if flag == "--payload-file":
                try:
                    value = Path(value).expanduser().read_text()
                except (OSError, UnicodeDecodeError) as exc:
                    raise BadArgumentError(
                        f"--payload-file {key}={value}: cannot read it: "
                        f"{getattr(exc, 'strerror', None) or exc}"
                    ) from None
            payload[key] = value
    return payload


@app.command("set")
def set_credential(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME", help="Name of the credential."),
    kind: str = typer.Option(
        "GENERIC",
        "--type",
        metavar="|".join(TYPES),
        help="REGISTRY (auth; registry, username), DATA (access_key_id, "
        "access_key, endpoint; region), GENERIC (any keys).",
    ),
    payload: list[str] | None = typer.Option(
        None, "--payload", metavar="KEY=VALUE", help="Key-value pairs (several after one flag)."
    ),
    payload_file: list[str] | None = typer.Option(
        None,
        "--payload-file",
        metavar="KEY=PATH",
        help="Key-value pairs whose value is read from a file.",
    ),
    fmt: Format = FormatOption,
) -> None:
    """Create or update a credential."""
    if kind not in TYPES:
        raise BadArgumentError(f"--type {kind!r}: one of {', '.join(TYPES)}")
    if bool(payload) == bool(payload_file):
        raise BadArgumentError("give one of --payload KEY=VALUE ... or --payload-file KEY=PATH ...")
    values = parse_payload(payload or [], payload_file or [])
    data: CredentialAnswer = Client().json(
        "POST", f"/api/credentials/{name}", json={"type": kind, "payload": values}
    )
    emit(
        data,
        _format(ctx, fmt),
        lambda d: console.print(f"Credential {d['name']} ({d['type']}) set", markup=False),
    )


@app.command("list")
def list_credentials(ctx: typer.Context, fmt: Format = FormatOption) -> None:
    """List your credentials (names, types and keys; never a value)."""
    data: list[CredentialAnswer] = Client().json("GET", "/api/credentials")
    emit(
        data,
        _format(ctx, fmt),
        lambda rows: table(
            ["name", "type", "keys", "created"],
            [[r["name"], r["type"], ",".join(r["keys"]), r.get("create_time")] for r in rows],
        ),
    )


@app.command("delete")
def delete_credential(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME", help="Delete the credential with this name."),
    fmt: Format = FormatOption,
) -> None:
    """Delete a credential."""
    data: DeletedAnswer = Client().json("DELETE", f"/api/credentials/{name}")
    emit(
        data,
        _format(ctx, fmt),
        lambda d: console.print(f"Credential {d['name']} deleted", markup=False),
    )
