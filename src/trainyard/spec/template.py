"""Render a spec's Jinja template, bounded in time and memory.

Templates are user code: rendered in Jinja's ``SandboxedEnvironment`` with ``StrictUndefined``
(an unset variable is an error naming it) in a forked child with capped address space
(``RLIMIT_AS``) and CPU time (``ITIMER_PROF``; a wall-clock backstop kills it), output bounded
by ``size.MAX_SPEC_BYTES``. Special tokens pass through untouched (inert placeholders). A
template whose only syntax is ``{{ name }}`` of scalar values is rendered without Jinja or the
child (``_render_plain``: ``str(value)``, same output and bound). Sources: OSMO docs,
"Templates and special tokens"; OSMO service defaults for rendering (0.5 s, 100 MiB).
"""

from __future__ import annotations

import json
import os
import re
import resource
import selectors
import signal
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from trainyard.errors import SpecError, SpecProblem
from trainyard.spec.size import MAX_SPEC_BYTES, check_spec_size, describe_bytes, text_bytes
from trainyard.spec.tokens import TOKEN_PATTERN
from trainyard.spec.yamlsource import parse_yaml

if TYPE_CHECKING:
    from jinja2.sandbox import SandboxedEnvironment

__all__ = ["RenderLimits", "DEFAULT_LIMITS", "render", "extract_default_values"]

MiB = 2**20
_TEMPLATE_NAME = "<template>"
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")
_DEFAULT_VALUES = re.compile(r"^default-values[ \t]*:", re.MULTILINE)
_TOP_LEVEL_LINE = re.compile(r"^[^\s#]", re.MULTILINE)
_UNDEFINED = re.compile(r"^'([^']+)' is undefined$")
_JINJA_SYNTAX = re.compile(r"\{[{%#]")
_TAG_START = re.compile(r"\{(?=[{%#])")
"""Every place Jinja may start a tag (overlapping: ``{{{`` has two)."""
_PLAIN_TAG = re.compile(r"\{\{[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*\}\}")
"""``{{ name }}``: a variable and nothing else (no ``-`` whitespace control, no filter)."""
_NOT_PLAIN_NAMES = frozenset(
    {
        "true",
        "false",
        "none",
        "True",
        "False",
        "None",  # Jinja's literals
        "and",
        "or",
        "not",
        "in",
        "is",
        "if",
        "else",
        "elif",
        "for",
        "recursive",  # its words
        "self",
        "loop",
        "caller",
        "varargs",
        "kwargs",
        "super",  # its special names
    }
)
"""Names a ``{{ name }}`` tag does not simply look up in Jinja: such a tag takes the child."""
_PLAIN_VALUE_TYPES = (str, int, float, bool, type(None))
"""Values written without the child: their text is short or their own (a list or mapping
may hold one long string many times through YAML aliases: its text is made in the child,
under its memory bound)."""


@cache
def _environment() -> SandboxedEnvironment:
    """The Jinja sandbox (jinja2 imported on first use: a plain template needs none)."""
    import jinja2
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )


@dataclass(frozen=True)
class RenderLimits:
    """Bounds on one template rendering.

    The bounds are for what a template *does*. Compiling a template costs time and memory
    in proportion to its length and to its number of tags (``{{``, ``{%``, ``{#``; about
    0.3 ms and 11 KiB each), so a long template gets an allowance on top of the bounds:
    ``time_s + time_per_mib_s * MiB + time_per_tag_s * tags`` and
    ``memory_bytes + memory_per_byte * bytes + memory_per_tag * tags``.

    Time is CPU time of the rendering child (user and system, compiling included), so a
    busy machine does not refuse a template that a quiet one accepts; a wall-clock
    backstop of ``max(10 * time_s, time_s + 10)`` seconds ends a child that never answers.

    Attributes:
        time_s: CPU seconds the rendering may use.
        memory_bytes: address space the rendering may add to the process.
        time_per_mib_s, time_per_tag_s: extra seconds per MiB of text and per tag.
        memory_per_byte, memory_per_tag: extra bytes per byte of text and per tag.
        output_bytes: the most bytes (UTF-8) of rendered text (``MAX_SPEC_BYTES``).
    """

    time_s: float = 0.5
    memory_bytes: int = 100 * MiB
    time_per_mib_s: float = 0.5
    time_per_tag_s: float = 0.0005
    memory_per_byte: int = 16
    memory_per_tag: int = 16 * 1024
    output_bytes: int = MAX_SPEC_BYTES

    def for_template(self, size: int, tags: int) -> RenderLimits:
        """The bounds for a template of ``size`` bytes and ``tags`` tags (allowances added,
        none left to add)."""
        return RenderLimits(
            time_s=self.time_s + self.time_per_mib_s * size / MiB + self.time_per_tag_s * tags,
            memory_bytes=self.memory_bytes
            + self.memory_per_byte * size
            + self.memory_per_tag * tags,
            time_per_mib_s=0,
            time_per_tag_s=0,
            memory_per_byte=0,
            memory_per_tag=0,
            output_bytes=self.output_bytes,
        )


DEFAULT_LIMITS = RenderLimits()


class _RenderFailure(Exception):
    def __init__(self, kind: str, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.line = kind, message, line


def extract_default_values(text: str, *, file: str | None = None) -> dict[str, Any]:
    """Read the ``default-values`` section of an unrendered spec.

    The section must be plain YAML: it is cut from the text (from the top-level
    ``default-values:`` line to the next top-level line) and parsed before rendering.

    Raises:
        SpecError: the section is not YAML or not a mapping.
    """
    match = _DEFAULT_VALUES.search(text)
    if not match:
        return {}
    end = _TOP_LEVEL_LINE.search(text, match.end())
    section = text[match.start() : end.start() if end else len(text)]
    line = text.count("\n", 0, match.start()) + 1
    try:
        data = parse_yaml(section).data
    except SpecError as exc:
        reason = exc.problems[0].message.split("; ")[0]
        raise _spec_error(
            f"{reason}; default-values must be plain YAML (no template syntax)",
            line + (exc.problems[0].line or 1) - 1,
            file,
            "default-values",
        ) from None
    values = data.get("default-values") if isinstance(data, dict) else None
    if values is not None and not isinstance(values, dict):
        raise _spec_error(
            "must be a mapping of name: value; write one value per line",
            line,
            file,
            "default-values",
        )
    return values or {}


def render(
    text: str,
    *,
    values: Mapping[str, Any] | None = None,
    set_strings: Mapping[str, str] | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
    file: str | None = None,
) -> str:
    """Render a spec template to YAML text, special tokens kept.

    Args:
        text: the spec as written (YAML with Jinja).
        values: ``--set`` values, already typed (int, float, bool, str); override
            ``default-values``.
        set_strings: ``--set-string`` values; override both.
        limits: time and memory bounds of the rendering.
        file: the spec's file name, for error messages.

    Returns:
        The rendered text. Special tokens are exactly as written; a value given for a
        token's name is ignored. Text without template syntax is returned as it is.

    Raises:
        SpecError: a text over ``MAX_SPEC_BYTES``, an unset variable (named), a syntax error,
            a sandbox violation, or a rendering past its time, memory or output limit; one
            problem with the template line.
    """
    check_spec_size(text_bytes(text), file=file)
    context = {**extract_default_values(text, file=file), **(values or {}), **(set_strings or {})}
    protected, tokens = _protect_tokens(text)
    if not _JINJA_SYNTAX.search(protected):
        return text
    output = _render_plain(protected, context, limits.output_bytes)
    if output is None:
        effective = limits.for_template(len(protected), len(_JINJA_SYNTAX.findall(protected)))
        try:
            output = _render_in_child(protected, context, effective)
        except _RenderFailure as exc:
            raise _spec_error(_describe(exc, effective), exc.line, file, "") from None
    rendered = _restore_tokens(output, tokens)
    if len(rendered) != len(output):  # tokens are longer than their placeholders
        check_spec_size(text_bytes(rendered), what="the rendered spec", file=file)
    return rendered


def _render_plain(text: str, context: Mapping[str, Any], output_bytes: int) -> str | None:
    """``text`` rendered as Jinja renders it, without Jinja, when its only template syntax is
    ``{{ name }}`` tags (``_PLAIN_TAG``) of names ``context`` holds with a scalar value
    (``_PLAIN_VALUE_TYPES``). None (the child renders it) for any other template, for one
    whose output would pass ``output_bytes`` or is not UTF-8 (the child reports that), and
    for a text with a ``\\r`` (Jinja turns ``\\r\\n`` and ``\\r`` into ``\\n``)."""
    if "\r" in text:
        return None
    tags = list(_PLAIN_TAG.finditer(text))
    starts = {tag.start() for tag in tags}
    if any(start.start() not in starts for start in _TAG_START.finditer(text)):
        return None  # a block, a comment, or a tag with more than a name
    pieces: list[str] = []
    size, at = 0, 0
    for tag in tags:
        value = _plain_value(context, tag.group(1))
        if value is None:
            return None
        pieces += (text[at : tag.start()], value)
        size += tag.start() - at + len(value)
        if size > output_bytes:
            return None
        at = tag.end()
    pieces.append(text[at:])
    return _within("".join(pieces), output_bytes)


def _plain_value(context: Mapping[str, Any], name: str) -> str | None:
    """What Jinja writes for ``{{ name }}``: ``str`` of the value; None when that is not
    a plain lookup of a scalar (a literal, a special name, a global, an undefined name, a
    list or mapping, an int of more digits than Python writes)."""
    if name in _NOT_PLAIN_NAMES or name not in context:
        return None
    value = context[name]
    if type(value) not in _PLAIN_VALUE_TYPES:
        return None
    try:
        return str(value)
    except ValueError:  # int above sys.get_int_max_str_digits()
        return None


def _within(output: str, output_bytes: int) -> str | None:
    """``output`` when it is UTF-8 (strictly, as the child's answer) of at most
    ``output_bytes`` bytes, else None."""
    try:
        size_bytes = len(output) if output.isascii() else len(output.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        return None
    return output if size_bytes <= output_bytes else None


def _protect_tokens(text: str) -> tuple[str, list[str]]:
    tokens: list[str] = []
    index: dict[str, int] = {}

    def swap(match: re.Match[str]) -> str:
        token = match.group(0)
        if token not in index:
            index[token] = len(tokens)
            tokens.append(token)
        return f"\x00{index[token]}\x00"

    return TOKEN_PATTERN.sub(swap, text), tokens


def _restore_tokens(text: str, tokens: list[str]) -> str:
    if not tokens:
        return text
    return _PLACEHOLDER.sub(lambda m: tokens[int(m.group(1))], text)


def _render_in_child(text: str, context: dict[str, Any], limits: RenderLimits) -> str:
    _environment()  # jinja2 imported here, once: the child inherits it (a server renders often)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reported through the pipe
        os.close(read_fd)
        _child_main(text, context, limits, write_fd)
    os.close(write_fd)
    try:
        payload = _read_until(read_fd, time.monotonic() + _backstop_s(limits), _payload_cap(limits))
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        _reap(pid)
        raise
    finally:
        os.close(read_fd)
    return _decode(payload, _reap(pid))


def _backstop_s(limits: RenderLimits) -> float:
    """Wall-clock seconds after which a child that made no answer is killed (the CPU
    limit normally ends it first; a busy machine may give it little CPU)."""
    return max(10 * limits.time_s, limits.time_s + 10)


def _reap(pid: int) -> int:
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:  # pragma: no cover - already reaped
        return 0


def _payload_cap(limits: RenderLimits) -> int:
    """The most bytes a child's answer may take: the output limit, its tag byte, and room
    for an error's JSON."""
    return limits.output_bytes + 1 + 64 * 1024


def _read_until(fd: int, deadline: float, cap_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                raise _RenderFailure("wall", "no answer")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > cap_bytes:
                raise _RenderFailure("output", "too much text")
            chunks.append(chunk)


def _decode(payload: bytes, status: int) -> str:
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGPROF, signal.SIGXCPU):
        raise _RenderFailure("time", "CPU time limit")
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        raise _RenderFailure("memory", "the renderer died without a whole answer")
    if payload[:1] == b"O":
        return payload[1:].decode("utf-8")
    kind, message, line = json.loads(payload[1:])
    raise _RenderFailure(kind, message, line)


def _child_main(
    text: str, context: dict[str, Any], limits: RenderLimits, fd: int
) -> None:  # pragma: no cover
    code = 0
    try:
        _cap_resources(limits)
        payload = _render_payload(text, context, limits.output_bytes)
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:  # noqa: BLE001 - the child must never return into the caller
        code = 1
    finally:
        os._exit(code)


def _cap_resources(limits: RenderLimits) -> None:  # pragma: no cover - child only
    for signum in (signal.SIGINT, signal.SIGPROF, signal.SIGXCPU):
        signal.signal(signum, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_PROF, limits.time_s)  # SIGPROF ends the child
    cpu_s = int(limits.time_s) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    try:
        with open("/proc/self/statm", "rb") as statm:
            used = int(statm.read().split()[0]) * resource.getpagesize()
    except OSError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = used + limits.memory_bytes
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _render_payload(text: str, context: dict[str, Any], output_bytes: int) -> bytes:
    import jinja2

    failure: tuple[str, str, int | None] | None = None
    try:
        output = _environment().from_string(text).render(context).encode("utf-8")
        if len(output) <= output_bytes:
            return b"O" + output
        failure = ("output", str(len(output)), None)
    except MemoryError:
        failure = ("memory", "memory limit", None)
    except jinja2.TemplateSyntaxError as exc:
        failure = ("syntax", str(exc.message), exc.lineno)
    except jinja2.exceptions.SecurityError as exc:
        failure = ("security", str(exc).rstrip("."), _template_line(exc))
    except jinja2.UndefinedError as exc:
        failure = ("undefined", str(exc.message), _template_line(exc))
    except (RecursionError, SyntaxError) as exc:
        failure = ("nesting", str(exc), _template_line(exc))
    except Exception as exc:  # noqa: BLE001 - any template failure becomes a spec problem
        failure = ("error", f"{type(exc).__name__}: {exc}", _template_line(exc))
    return b"E" + json.dumps(failure).encode("utf-8")


def _template_line(exc: BaseException) -> int | None:
    frames = traceback.extract_tb(exc.__traceback__)
    lines = [f.lineno for f in frames if f.filename == _TEMPLATE_NAME]
    return lines[-1] if lines else None


def _describe(exc: _RenderFailure, limits: RenderLimits) -> str:
    if exc.kind == "time":
        return (
            f"template rendering ran past its time limit of {limits.time_s:.2g} s of CPU; "
            "make the template do less work (smaller loops)"
        )
    if exc.kind == "wall":
        return (
            f"template rendering gave no answer within {_backstop_s(limits):.2g} s; "
            "make the template do less work, or try again when the machine is less busy"
        )
    if exc.kind == "memory":
        return (
            f"template rendering ran past its memory limit of "
            f"{limits.memory_bytes / MiB:.0f} MiB; make the template build less text"
        )
    if exc.kind == "output":
        size = f"is {describe_bytes(int(exc.message))}" if exc.message.isdigit() else "is larger"
        return (
            f"the rendered spec {size}, over the limit of "
            f"{describe_bytes(limits.output_bytes)} of spec text; make the template "
            "build less text"
        )
    if exc.kind == "undefined":
        return _describe_undefined(exc.message)
    if exc.kind == "security":
        return (
            f"template breaks the sandbox: {exc.message}; templates may not reach "
            "Python internals, use plain values and filters"
        )
    if exc.kind == "syntax":
        return f"template syntax error: {exc.message.rstrip('.')}; fix the Jinja syntax"
    if exc.kind == "nesting":
        return "template is nested too deeply to render; flatten loops, blocks or macros"
    return f"template error: {exc.message.rstrip('.')}; fix the template"


def _describe_undefined(message: str) -> str:
    match = _UNDEFINED.match(message)
    if not match:
        return f"template uses an undefined value: {message}; check the variable's fields"
    name = match.group(1)
    return (
        f"template variable {name!r} is not set; set it with --set {name}=VALUE "
        "or add it under default-values"
    )


def _spec_error(message: str, line: int | None, file: str | None, path: str) -> SpecError:
    return SpecError(
        [SpecProblem(path=path, message=" ".join(message.split()), line=line, file=file)]
    )
