"""Request bodies shared by the CLI and the server (pydantic only, so the CLI does not import
the engine, the store or SQLAlchemy to build one)."""

from __future__ import annotations

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
