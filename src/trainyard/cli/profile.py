"""``trainyard profile list|set`` (OSMO's ``osmo profile``): the user's settings.

The one setting trainyard has is OSMO's default pool (``profile set pool POOL``): the pool
of ``workflow submit``, ``workflow validate`` and ``app submit`` when neither ``--pool``
nor the spec names one. It is kept per user in ``$TRAINYARD_HOME/profile.json`` (0600);
the server is asked whether the pool exists when it is set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trainyard.cli.output import Format, FormatOption, emit, table
from trainyard.errors import ConfigError, NotFoundError
from trainyard.home import trainyard_home

if TYPE_CHECKING:
    from trainyard.server.answers import PoolAnswer, WhoamiAnswer

__all__ = ["app", "default_pool", "load_profile", "SETTINGS"]

app = typer.Typer(no_args_is_help=True, help="Your settings: the default pool (OSMO's `profile`).")

SETTINGS: dict[str, str] = {
    "pool": "the pool a spec runs on when neither --pool nor the spec names one"
}
"""Settings ``profile set`` takes, each with what it means."""

UNSUPPORTED: dict[str, str] = {
    "bucket": "trainyard has no default bucket: name the URL in the spec",
    "notifications": "trainyard sends no email or Slack notifications",
}
"""OSMO's other settings, each with why trainyard has none."""


def _path(home: Path | None = None) -> Path:
    return (home or trainyard_home()) / "profile.json"


def load_profile(home: Path | None = None) -> dict[str, Any]:
    """The saved settings (empty when none were set or the file is unreadable)."""
    try:
        data = json.loads(_path(home).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def default_pool(home: Path | None = None) -> str | None:
    """The user's default pool (``profile set pool``), else None."""
    pool = load_profile(home).get("pool")
    return pool if isinstance(pool, str) and pool else None


def _save(data: dict[str, Any]) -> None:
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".profile.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)


def _check_pool(pool: str) -> None:
    """Raise NotFoundError (exit 3) naming the pools when the server has no ``pool``."""
    from trainyard.cli.client import Client

    pools: list[PoolAnswer] = Client().json("GET", "/api/pool")
    names = [p["name"] for p in pools]
    if pool not in names:
        raise NotFoundError(f"unknown pool {pool!r}; pools: {', '.join(sorted(names))}")


@app.command("set")
def set_setting(
    setting: str = typer.Argument(..., metavar="SETTING", help="pool"),
    value: str = typer.Argument(..., metavar="VALUE", help="The pool's name."),
    enabled: str | None = typer.Argument(
        None, metavar="[ENABLED]", help="OSMO's notifications switch (not used here)."
    ),
) -> None:
    """Set a setting of your profile: `profile set pool POOL` makes POOL your default pool."""
    if setting in UNSUPPORTED:
        raise ConfigError(f"profile setting {setting!r}: {UNSUPPORTED[setting]}")
    if setting not in SETTINGS:
        raise typer.BadParameter(
            f"unknown setting {setting!r}; settings: {', '.join(SETTINGS)}", param_hint="SETTING"
        )
    if enabled is not None:
        raise typer.BadParameter("ENABLED goes with notifications only", param_hint="ENABLED")
    _check_pool(value)
    _save({**load_profile(), setting: value})
    typer.echo(f"Default pool set to {value}")


@app.command("list")
def list_settings(fmt: Format = FormatOption) -> None:
    """Show your profile: who you are to the server and your default pool. JSON:
    {"user", "admin", "pool"} (pool null when none is set)."""
    from trainyard.cli.client import Client

    who: WhoamiAnswer = Client().json("GET", "/api/whoami")
    data = {"user": who["user"], "admin": who["admin"], "pool": default_pool()}
    emit(
        data,
        fmt,
        lambda d: table(
            ["setting", "value"],
            [
                ["user", d["user"]],
                ["admin", "yes" if d["admin"] else "no"],
                ["pool", d["pool"] or "- (the spec's, else local)"],
            ],
        ),
    )
