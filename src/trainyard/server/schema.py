"""Request bodies shared by the CLI and the server (pydantic only, so the CLI does not import
the engine, the store or SQLAlchemy to build one)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from trainyard.errors import SpecError, SpecProblem

__all__ = ["SpecRequest", "APP_NAME", "check_app_name"]

APP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What an app may be called: as a dataset (letters, digits, ``.``, ``_``, ``-``)."""


def check_app_name(name: str) -> str:
    """``name`` when it is a valid app name.

    Raises:
        SpecError: any other character (a NUL, a newline, U+202E, a slash would forge or
            garble a row of ``app list``), or more than 128 characters; the name is shown
            escaped.
    """
    if APP_NAME.fullmatch(name):
        return name
    raise SpecError(
        [
            SpecProblem(
                "app name",
                f"{ascii(name)[:140]} is no valid app name: use "
                "letters, digits, '.', '_' and '-' (at most 128, starting "
                "with a letter or digit)",
            )
        ]
    )


class SpecRequest(BaseModel):
    """A spec as the CLI sends it: text, its ``localpath`` files inlined, and parameters."""

    spec_text: str
    spec_name: str = "spec.yaml"
    files: dict[str, str] = Field(default_factory=dict)
    set: list[str] = Field(default_factory=list)
    set_string: list[str] = Field(default_factory=list)
    set_env: list[str] = Field(default_factory=list)
    pool: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    default_pool: str | None = None
    """The pool when neither ``pool`` nor the spec names one (the user's profile, OSMO's
    ``profile set pool``)."""
    priority: Literal["HIGH", "NORMAL", "LOW"] | None = None
    """OSMO's workflow priority (``workflow submit --priority``), kept with the workflow;
    None is NORMAL (OSMO's default)."""
    app: str | None = None
    """``NAME:VERSION`` of the app it is submitted from (set by the server, never the CLI)."""
