"""The size limit of a spec: ``MAX_SPEC_BYTES`` of text, checked everywhere a spec enters.

A spec is a recipe, not data: large data belongs in a dataset or behind a URL input. The
limit bounds what one submission costs the server (memory while it is checked, rows in the
store), whoever sends it. It is checked on the spec as written (and before a file is read),
on the spec with the ``localpath`` files it inlines, and on the rendered text (a small
template may expand), by the CLI before it sends anything and again by the server.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainyard.errors import SpecError, SpecProblem

__all__ = ["MAX_SPEC_BYTES", "text_bytes", "check_spec_size", "check_source_size", "describe_bytes"]

MAX_SPEC_BYTES = 4 * 2**20
"""The most bytes (UTF-8) of spec text trainyard accepts: 4 MiB."""


def text_bytes(text: str) -> int:
    """The size of ``text`` in UTF-8 bytes (lone surrogates count as 3 bytes)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def describe_bytes(size_bytes: int) -> str:
    """``52428800`` -> ``50.0 MiB (52,428,800 bytes)``."""
    return f"{size_bytes / 2**20:.1f} MiB ({size_bytes:,} bytes)"


def check_spec_size(
    size_bytes: int,
    *,
    what: str = "the spec",
    file: str | None = None,
    limit_bytes: int = MAX_SPEC_BYTES,
) -> None:
    """Refuse ``size_bytes`` of spec text over ``limit_bytes``.

    Args:
        size_bytes: the size of the text, in bytes.
        what: what was measured, for the message (``the spec``, ``the rendered spec``).
        file: the spec file, for the message.
        limit_bytes: the limit (``MAX_SPEC_BYTES``).

    Raises:
        SpecError: one problem naming the size and the limit (exit 2).
    """
    if size_bytes <= limit_bytes:
        return
    message = (
        f"{what} is {describe_bytes(size_bytes)}, over the limit of "
        f"{describe_bytes(limit_bytes)} of spec text; make it smaller (large data "
        "belongs in a dataset or a URL input)"
    )
    raise SpecError([SpecProblem("", message, None, file)])


def check_source_size(
    text: str, files: Mapping[str, str] | None = None, *, file: str | None = None
) -> None:
    """Refuse a spec as written over ``MAX_SPEC_BYTES``, or with the ``localpath`` files it
    inlines (``files``: path to contents) over it together.

    Raises:
        SpecError: as ``check_spec_size``.
    """
    size = text_bytes(text)
    check_spec_size(size, file=file)
    if files:
        size += sum(text_bytes(contents) for contents in files.values())
        check_spec_size(size, what="the spec with its localpath files", file=file)
