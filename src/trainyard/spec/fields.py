"""Parsers and checks for single spec fields: names, exit codes, labels, mounts, paths.

Each function takes the raw YAML value and either returns the normalised value or raises
``ValueError`` with a one-line message saying what is wrong and what to do. The pydantic
models call them from their validators; they are public so that other layers (CLI, server)
can check a single value the same way.

Sources: OSMO docs, "Workflow specification" sections "Exit actions", "Host mounts",
"File injection", "Inputs and outputs"; Kubernetes docs, "Labels and selectors" (syntax).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping

__all__ = [
    "RESERVED_DIR",
    "MAX_LABELS",
    "MAX_EXIT_CODE",
    "check_name",
    "name_key",
    "parse_exit_codes",
    "format_exit_codes",
    "check_labels",
    "check_label_key",
    "check_label_value",
    "split_mount",
    "check_env_name",
    "check_url",
    "check_regex",
    "check_file_path",
    "split_task_ref",
    "check_task_ref",
    "check_credential_name",
    "check_credential",
]

KERNEL_DIRS = ("/dev", "/proc", "/sys")
"""Folders every task gets from the kernel (a container's ``/dev``, ``/proc``, ``/sys``): a
file written there before the command starts is hidden by them."""
RESERVED_DIR = "/trainyard"
"""Folder of the task sandbox reserved for the task runner; spec files may not write there."""

MAX_LABELS = 16
MAX_EXIT_CODE = 255
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S*$")
_WORKFLOW_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?$")
_CODE_PART = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def check_name(value: str) -> str:
    """Check a workflow, group or task name.

    Names become host names and folder names, so they follow DNS-label rules with ``_``
    allowed: 1-63 ASCII letters, digits, ``-`` and ``_``, starting and ending with a letter
    or digit.

    Raises:
        ValueError: the name breaks the rule; the message shows the rule.
    """
    if not _NAME.match(value):
        raise ValueError(
            f"invalid name {value!r}; use 1-63 ASCII letters, digits, '-' or '_', "
            "starting and ending with a letter or digit"
        )
    return value


def name_key(name: str) -> str:
    """The key under which two names count as the same: lower case, ``_`` read as ``-``.

    Source: OSMO maps task names to host names, where case and ``-``/``_`` are not kept apart.
    """
    return name.lower().replace("_", "-")


def _code_range(part: str, max_code: int = MAX_EXIT_CODE) -> range:
    match = _CODE_PART.match(part)
    if not match:
        raise ValueError(
            f"invalid exit code {part.strip()!r}; use codes and ranges such as 0,1-10,16"
        )
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    if high < low:
        raise ValueError(f"exit code range {part.strip()!r} is reversed; write it as {high}-{low}")
    if high > max_code:
        raise ValueError(
            f"exit code {high} is out of range; exit codes are 0-{max_code} "
            "(higher codes are reserved for trainyard)"
        )
    return range(low, high + 1)


def parse_exit_codes(value: object, max_code: int = MAX_EXIT_CODE) -> frozenset[int]:
    """Parse the exit codes of one exit action: ``"0,1-10,16"``, a bare int, or a list.

    Args:
        value: a string of comma-separated codes and inclusive ranges, an int, or an
            iterable of ints (the normalised form, so a dumped spec loads again).
        max_code: the highest code allowed: a spec's 255; a pool's ``default_exit_actions``
            reach OSMO's service codes (``pools.MAX_POOL_EXIT_CODE``).

    Returns:
        The set of codes, each within 0-``max_code``.

    Raises:
        ValueError: a code above ``max_code``, a reversed range, or text that is not codes.

    Source: OSMO docs, "Exit actions" (format ``start1-end1,num2,...``, codes up to 255).
    """
    if isinstance(value, bool) or value is None:
        raise ValueError(f"expected exit codes such as 0,1-10,16 or 3, got {value!r}")
    if isinstance(value, int):
        return frozenset(_code_range(str(value), max_code))
    if isinstance(value, str):
        parts = value.split(",")
    elif isinstance(value, Iterable):
        parts = [str(v) if isinstance(v, int) and not isinstance(v, bool) else "x" for v in value]
    else:
        raise ValueError(f"expected exit codes such as 0,1-10,16 or 3, got {value!r}")
    codes: set[int] = set()
    for part in parts:
        codes.update(_code_range(part, max_code))
    return frozenset(codes)


def format_exit_codes(codes: Iterable[int]) -> str:
    """The shortest text form of a set of exit codes (``{0,1,2,5}`` -> ``"0-2,5"``).

    ``parse_exit_codes(format_exit_codes(s)) == frozenset(s)`` for codes within 0-255.
    """
    ordered = sorted(set(codes))
    parts: list[str] = []
    start = prev = None
    for code in ordered + [None]:
        if prev is not None and code == prev + 1:
            prev = code
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = code
    return ",".join(parts)


def check_label_key(key: str) -> str:
    """Check a label key: ``[prefix/]name``, Kubernetes syntax.

    Raises:
        ValueError: the key breaks the syntax; the message shows it.
    """
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise ValueError(
            f"invalid label key {key!r}; a prefix must be a DNS subdomain such as example.com"
        )
    if not _LABEL_NAME.match(name):
        raise ValueError(
            f"invalid label key {key!r}; use 1-63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit, optionally after a prefix such as example.com/"
        )
    return key


def check_label_value(value: object) -> str:
    """Check a label value: a non-empty string in Kubernetes label-value syntax.

    Raises:
        ValueError: not a string, empty, or bad syntax; the message says which.
    """
    if not isinstance(value, str):
        kind = type(value).__name__
        raise ValueError(
            f"a label value must be a string, got a {kind}; give a string, quoted if needed"
        )
    if not value:
        raise ValueError("a label value must be non-empty; give a value or drop the label")
    if not _LABEL_NAME.match(value):
        raise ValueError(
            f"invalid label value {value!r}; use 1-63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return value


def check_labels(value: object) -> object:
    """Check the shape of the ``labels`` mapping: a mapping with at most 16 entries.

    Keys and values are checked one by one with :func:`check_label_key` and
    :func:`check_label_value`, so that every bad label is reported.

    Raises:
        ValueError: not a mapping, or too many labels.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"labels must be a mapping of key: value, got a {type(value).__name__}")
    if len(value) > MAX_LABELS:
        raise ValueError(f"{len(value)} labels given; at most {MAX_LABELS} are allowed, drop some")
    return value


def split_mount(value: str) -> tuple[str, str]:
    """Split a volume mount ``/src`` or ``/src:/dst`` into (host source, task destination).

    Raises:
        ValueError: more than one ``:``, an empty or relative part.

    Source: OSMO docs, "Host mounts".
    """
    parts = value.split(":")
    if len(parts) > 2:
        raise ValueError(f"volume mount {value!r} has more than one ':'; use /src or /src:/dst")
    source, dest = parts[0], parts[-1]
    for part in (source, dest):
        if not part.startswith("/"):
            raise ValueError(f"volume mount {value!r} needs absolute paths; use /src or /src:/dst")
    return posixpath.normpath(source), posixpath.normpath(dest)


def check_env_name(name: str) -> str:
    """Check an environment variable name (letters, digits, ``_``, not starting with a digit).

    Raises:
        ValueError: the name breaks the rule.
    """
    if not _ENV_NAME.match(name):
        raise ValueError(
            f"invalid environment variable name {name!r}; use letters, digits and '_', "
            "not starting with a digit"
        )
    return name


def check_url(value: str) -> str:
    """Check a storage URL: ``scheme://rest`` with no spaces (``s3://b/p``, ``file:///d``).

    Raises:
        ValueError: no scheme, or white space.
    """
    if not _URL.match(value):
        raise ValueError(
            f"invalid URL {value!r}; use a storage URL such as s3://bucket/path or file:///dir"
        )
    return value


def check_regex(value: str) -> str:
    """Check that ``value`` compiles as a Python regular expression.

    Raises:
        ValueError: it does not; the message carries the compiler's reason.
    """
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"invalid regex {value!r}: {exc}; fix the expression") from exc
    return value


def check_file_path(value: str) -> str:
    """Check the in-task path of a ``files`` entry: absolute, not in the runner's folder.

    Raises:
        ValueError: relative, a folder (trailing ``/``), under ``/trainyard``, or under
            ``/dev``, ``/proc``, ``/sys`` (``KERNEL_DIRS``).
    """
    if not value.startswith("/"):
        raise ValueError(f"file path {value!r} must be absolute; write it as /{value}")
    normal = posixpath.normpath(value)
    if value.endswith("/") or normal == "/":
        raise ValueError(
            f"file path {value!r} names a folder; give a file path such as /tmp/run.sh"
        )
    if normal == RESERVED_DIR or normal.startswith(RESERVED_DIR + "/"):
        raise ValueError(
            f"file path {value!r} is inside {RESERVED_DIR}, which the task runner reserves; "
            "write the file elsewhere, such as /tmp"
        )
    for folder in KERNEL_DIRS:
        if normal == folder or normal.startswith(folder + "/"):
            raise ValueError(
                f"file path {value!r} is inside {folder}, which the task's own "
                f"{folder} file system covers (the file would vanish); write it "
                "elsewhere, such as /tmp"
            )
    return value


def split_task_ref(value: str) -> tuple[str | None, str]:
    """Split a ``task:`` input into (workflow id, task name).

    ``TASK`` names a task of this workflow (workflow id ``None``); ``WORKFLOW_ID:TASK`` names
    a task of another workflow, such as ``producer-1:make``. Only the second form is checked
    here (a plain name is matched against the workflow's tasks by the cross checks).

    Raises:
        ValueError: more than one ``:``, or an empty or malformed workflow id or task name.

    Source: OSMO docs, "Inputs and outputs" (``task:``; ``WORKFLOW_ID:TASK`` is trainyard's).
    """
    if ":" not in value:
        return None, value
    workflow_id, _, task = value.partition(":")
    form = "use WORKFLOW_ID:TASK such as producer-1:make"
    if ":" in task:
        raise ValueError(f"input task {value!r} has more than one ':'; {form}")
    if not _WORKFLOW_ID.match(workflow_id):
        raise ValueError(
            f"input task {value!r} has an empty or invalid workflow id {workflow_id!r}; {form}"
        )
    try:
        check_name(task)
    except ValueError:
        raise ValueError(
            f"input task {value!r} has an empty or invalid task name {task!r}; {form}"
        ) from None
    return workflow_id, task


def check_task_ref(value: str) -> str:
    """Check a ``task:`` input with :func:`split_task_ref`; returns it unchanged.

    Raises:
        ValueError: as :func:`split_task_ref`.
    """
    split_task_ref(value)
    return value


def check_credential_name(name: str) -> str:
    """Check the name of a credential a task uses (the name it was stored under).

    Raises:
        ValueError: not 1-63 ASCII letters, digits, ``-`` or ``_``, starting and ending with
            a letter or digit.
    """
    if not _NAME.match(name):
        raise ValueError(
            f"invalid credential name {name!r}; use the name the credential was stored under: "
            "1-63 ASCII letters, digits, '-' or '_'"
        )
    return name


def check_credential(value: object) -> str | dict[str, str]:
    """Check how a task uses one credential: a folder path, or environment variables.

    Args:
        value: an absolute path where the credential's files are mounted (``/root/.osmo``),
            or a mapping from environment variable to a key of the credential
            (``{OMNI_USER: omni_user}``).

    Returns:
        The path unchanged, or the mapping as a ``dict``.

    Raises:
        ValueError: any other type, a relative path or one under ``/trainyard``, an empty
            mapping, an invalid variable name, or a key that is not a non-empty string.

    Source: OSMO docs, "Secrets" (``credentials``).
    """
    if isinstance(value, str):
        return _credential_path(value)
    if not isinstance(value, Mapping):
        raise ValueError(
            f"a credential is used as a path such as /root/.creds or as a mapping "
            f"VARIABLE: key, got {_kind(value)}"
        )
    if not value:
        raise ValueError("the credential maps no environment variable; give VARIABLE: key lines")
    return {str(var): _credential_key(var, key) for var, key in value.items()}


def _kind(value: object) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _credential_path(value: str) -> str:
    normal = posixpath.normpath(value) if value else ""
    if not value.startswith("/") or normal == "/":
        raise ValueError(
            f"credential path {value!r} must be an absolute folder such as /root/.creds, "
            "where the credential's files are mounted"
        )
    if normal == RESERVED_DIR or normal.startswith(RESERVED_DIR + "/"):
        raise ValueError(
            f"credential path {value!r} is inside {RESERVED_DIR}, which the task "
            "runner reserves; mount it elsewhere"
        )
    return value


def _credential_key(var: object, key: object) -> str:
    if not isinstance(var, str):
        raise ValueError(f"environment variable {var!r} must be a name; quote it if needed")
    check_env_name(var)
    if not isinstance(key, str) or not key:
        raise ValueError(
            f"{var} must name a key of the credential as a non-empty string, got {key!r}"
        )
    return key
