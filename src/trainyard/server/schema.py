"""Request bodies shared by the CLI and the server (pydantic only, so the CLI does not import
the engine, the store or SQLAlchemy to build one)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["SpecRequest"]


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
