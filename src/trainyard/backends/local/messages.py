"""The launcher's messages, shared by its client (the local backend) and the launcher: one
JSON request line per connection, a tagged union on ``op``, and one JSON reply line (an
``ErrorReply`` on failure). ``parse_request`` is the one place a request is read; what each
op does is in ``backends.local.launcher``'s docstring.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

__all__ = [
    "ErrorReply",
    "LauncherRequest",
    "MalformedRequest",
    "Network",
    "NetworkReply",
    "NetworkSpec",
    "Ping",
    "PidReply",
    "Release",
    "Run",
    "RunMany",
    "RunManyReply",
    "RunReply",
    "RunSpec",
    "StartReply",
    "Stop",
    "StopReply",
    "parse_request",
    "parse_run",
]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NetworkSpec(_Message):
    """A group's network namespace: ``group`` (its key), ports forwarded from the host's
    loopback into it (``forward``), and whether it gets egress (``egress``)."""

    group: str
    forward: list[int] = Field(default_factory=list)
    egress: bool = True


class RunSpec(_Message):
    """One runner start (``run``, or one entry of ``run_many``): its ``run.json``, the file
    its stdout and stderr go to (``out``), its working folder (``cwd``), its environment
    (``env``: None in a ``run_many`` entry takes the request's), its group key, ``mode``
    (``process``: a forked runner; ``thread``: hosted by the launcher), the namespace a
    hosted runner joins (``network``), and where to record the start (``launch_json``, with
    the ``launch`` fields plus ``pid`` and ``created``)."""

    run_json: str
    out: str
    cwd: str
    env: dict[str, str] | None = None
    group: str | None = None
    mode: Literal["process", "thread"] = "process"
    network: NetworkSpec | None = None
    launch_json: str | None = None
    launch: dict[str, Any] = Field(default_factory=dict)


class Ping(_Message):
    """Is a launcher there? -> ``PidReply``."""

    op: Literal["ping"] = "ping"


class Release(_Message):
    """Exit once no runner is left -> ``PidReply``."""

    op: Literal["release"] = "release"


class Stop(_Message):
    """Stop the hosted runner of ``run_dir`` (``force``: SIGKILL now) -> ``StopReply``."""

    op: Literal["stop"] = "stop"
    run_dir: str
    force: bool = False


class Network(NetworkSpec):
    """The group's namespace, made if none is alive -> ``NetworkReply``."""

    op: Literal["network"] = "network"


class Run(RunSpec):
    """Start one runner -> ``StartReply``."""

    op: Literal["run"] = "run"
    env: dict[str, str]


class RunMany(_Message):
    """Start several runners, each on its own (``env``: for those naming none) ->
    ``RunManyReply``."""

    op: Literal["run_many"] = "run_many"
    env: dict[str, str] = Field(default_factory=dict)
    runs: list[RunSpec]


LauncherRequest = Annotated[
    Ping | Release | Stop | Network | Run | RunMany, Field(discriminator="op")
]
"""Every request the launcher answers, told apart by ``op``."""

_REQUEST: TypeAdapter[LauncherRequest] = TypeAdapter(LauncherRequest)


class MalformedRequest(ValueError):
    """A request line that is no launcher request (bad JSON, unknown ``op``, a field
    missing, of the wrong type or unknown)."""


def parse_request(line: bytes | str) -> LauncherRequest:
    """The request of one JSON line.

    Raises:
        MalformedRequest: one line naming the first bad field and what is wrong with it.
    """
    try:
        return _REQUEST.validate_json(line)
    except ValidationError as exc:
        raise MalformedRequest(_say_what(exc)) from None


def parse_run(job: bytes) -> RunSpec:
    """A runner's job as the launcher hands it to a forked spare (``RunSpec`` as JSON).

    Raises:
        MalformedRequest: as ``parse_request``.
    """
    try:
        return RunSpec.model_validate_json(job)
    except ValidationError as exc:
        raise MalformedRequest(_say_what(exc)) from None


def _say_what(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the request"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"malformed launcher request: {where}: {first['msg']}{more}"


class ErrorReply(TypedDict):
    """Why a request (or one start of ``run_many``) failed: ``ExceptionType: message``."""

    error: str


class PidReply(TypedDict):
    """The launcher's pid (``ping``, ``release``)."""

    pid: int


class StopReply(TypedDict):
    """Whether the stopped runner's thread still runs."""

    running: bool


class NetworkReply(TypedDict):
    """A group's namespace: its holder (``ns_pid``, ``ns_created`` in s since the epoch),
    whether it lives in a user namespace of its own, and ``ns_path``
    (``/proc/PID/fd/N`` when the launcher holds it as a descriptor, else None)."""

    launcher_pid: int
    ns_pid: int
    ns_created: float
    user_ns: bool
    ns_path: str | None


class StartReply(TypedDict):
    """The process that runs a started runner: pid and create time (s since the epoch)."""

    pid: int
    created: float


class RunReply(StartReply, total=False):
    """A ``run_many`` start: ``StartReply`` and whether its ``launch_json`` was written."""

    recorded: bool


class RunManyReply(TypedDict):
    """Per start of a ``run_many``, in order: its reply or its own error."""

    results: list[RunReply | ErrorReply]
