"""``trainyard workflow``: validate a spec, show it rendered, print the language's schema.

``validate`` and ``spec`` ask the server when one is configured (``$TRAINYARD_SERVER_URL``)
or the local one already runs, since the server knows the pools its team uses; otherwise
(or with ``--local``) they check on this machine against ``$TRAINYARD_HOME/pools.yaml``,
and never start a server. Thin: each command turns its options into arguments of
``trainyard.spec`` or a server request and prints. Errors are raised, never printed here
(``cli.main`` prints them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainyard import spec
from trainyard.cli.client import Client, running_server_client
from trainyard.cli.output import Format, FormatOption, emit, print_spec_warnings, spec_warnings
from trainyard.cli.request import SpecBody, spec_request
from trainyard.errors import SpecError, SpecProblem

if TYPE_CHECKING:  # pools (its models, psutil: ~30 ms) only for a check here
    from trainyard.pools import Pool
    from trainyard.server.answers import ValidateAnswer

__all__ = ["app", "SpecOptions"]

app = typer.Typer(
    help="Submit, watch and manage workflows; validate and render specs.", no_args_is_help=True
)

SpecArg = Annotated[
    Path, typer.Argument(help="The workflow spec (YAML with Jinja).", metavar="SPEC")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="NAME=VALUE",
        help="Template value, YAML-typed (int, float, bool, string). Several pairs may follow one flag.",
    ),
]
SetStringOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set-string",
        metavar="NAME=VALUE",
        help="Template value kept as a string; wins over --set.",
    ),
]
SetEnvOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set-env", metavar="NAME=VALUE", help="Environment variable added to every task."
    ),
]
LabelOpt = Annotated[
    list[str] | None,
    typer.Option("--label", metavar="KEY=VALUE", help="Workflow label; overrides the spec's."),
]
PoolOpt = Annotated[
    str | None,
    typer.Option(
        "--pool",
        "-p",
        help="Pool to check against (default: the spec's pool, else your default "
        "pool: `profile set pool`, else 'local').",
    ),
]
LocalOpt = Annotated[
    bool,
    typer.Option(
        "--local",
        help="Check on this machine against $TRAINYARD_HOME/pools.yaml even when a "
        "server is configured or running.",
    ),
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Treat warnings (e.g. a key given twice in one mapping) as problems: "
        "the spec is refused (exit 2).",
    ),
]

WHERE_CHECKED = (
    "Checked by the server when one is configured (TRAINYARD_SERVER_URL) or the local one "
    "already runs, against the pools it serves; otherwise (or with --local) on this machine "
    "against $TRAINYARD_HOME/pools.yaml. Never starts a server."
)


@dataclass(frozen=True)
class SpecOptions:
    """The options every spec command takes, parsed."""

    set_values: dict[str, Any]
    set_strings: dict[str, str]
    set_env: dict[str, str]
    labels: dict[str, str]
    pool: str | None

    @classmethod
    def parse(
        cls,
        set_: list[str] | None,
        set_string: list[str] | None,
        set_env: list[str] | None,
        label: list[str] | None,
        pool: str | None,
    ) -> SpecOptions:
        """Parse the raw ``NAME=VALUE`` lists (raises ``SpecError`` on a malformed pair)."""
        return cls(
            spec.parse_set_values(set_ or []),
            spec.parse_set_strings(set_string or []),
            spec.parse_env(set_env or []),
            spec.parse_labels(label or []),
            pool,
        )

    def choose_pool(self, spec_pool: str | None) -> Pool:
        """``--pool``, else the spec's ``workflow.pool``, else the user's default pool
        (``profile set pool``), else ``local`` (from pools.yaml)."""
        from trainyard.backends.served import get_pool
        from trainyard.cli.profile import default_pool

        return get_pool(self.pool or spec_pool or default_pool())


def _render(path: Path, options: SpecOptions) -> str:
    return spec.render_source(path, set_values=options.set_values, set_strings=options.set_strings)


def _parse(rendered: str, path: Path, options: SpecOptions) -> spec.SpecDocument:
    return spec.parse(
        rendered,
        spec_path=path,
        set_env=options.set_env,
        labels=options.labels,
        pool=options.choose_pool,
    )


def _server_request(
    path: Path,
    set_: list[str] | None,
    set_string: list[str] | None,
    set_env: list[str] | None,
    label: list[str] | None,
    pool: str | None,
) -> SpecBody:
    """The request for the server, after the same checks of the options as locally."""
    from trainyard.cli.profile import default_pool

    SpecOptions.parse(set_, set_string, set_env, label, pool)
    req = spec_request(
        path,
        set_values=set_ or [],
        set_strings=set_string or [],
        set_env=set_env or [],
        pool=pool,
        labels=spec.parse_labels(label or []),
    )
    return replace(req, default_pool=default_pool())


def _spec_server(local: bool) -> Client | None:
    return None if local else running_server_client()


def _validate_locally(path: Path, options: SpecOptions) -> dict[str, Any]:
    doc = _parse(_render(path, options), path, options)
    return {
        "valid": True,
        "name": doc.workflow.name,
        "pool": options.choose_pool(doc.workflow.pool).name,
        "server": None,
        "warnings": [w.to_json() for w in doc.warnings],
    }


def _emit_problems(exc: SpecError, fmt: Format) -> None:
    if fmt is Format.json:
        emit(
            {
                "valid": False,
                "problems": [p.to_json() for p in exc.problems],
                "warnings": [w.to_json() for w in exc.warnings],
            },
            fmt,
            lambda _d: None,
        )


def _line_order(problem: SpecProblem) -> tuple[bool, int]:
    return problem.line is None, problem.line or 0


def _strict(warnings: list[SpecProblem]) -> None:
    """``--strict``: the warnings refuse the spec (SpecError, exit 2)."""
    if warnings:
        raise SpecError(warnings)


@app.command(
    "validate",
    help=f"""Render and check a spec; print every problem to stderr
(exit 2) or success (exit 0). Warnings (e.g. a key given twice in one mapping: the last
value is used, as in OSMO) go to stderr and do not change the exit status, unless --strict
makes them problems. {WHERE_CHECKED} With --format json, stdout is one object:
{{"valid": true, "name", "pool", "server": URL or null, "warnings": [...]}}, or
{{"valid": false, "problems": [{{"path", "message", "line", "file"}}], "warnings": [...]}}
(warnings have the problems' shape; the problems also go to stderr, exit 2).""",
)
def validate_command(
    path: SpecArg,
    set_: SetOpt = None,
    set_string: SetStringOpt = None,
    set_env: SetEnvOpt = None,
    label: LabelOpt = None,
    pool: PoolOpt = None,
    local: LocalOpt = False,
    strict: StrictOpt = False,
    fmt: Format = FormatOption,
) -> None:
    try:
        result = _validate(path, set_, set_string, set_env, label, pool, local)
        warnings = spec_warnings(result)
        if strict:
            _strict(warnings)
    except SpecError as exc:
        if strict and exc.warnings:
            exc = SpecError(sorted(exc.problems + exc.warnings, key=_line_order))
        _emit_problems(exc, fmt)
        raise exc from None
    print_spec_warnings(warnings)
    emit(result, fmt, lambda _d: typer.echo("Workflow validation succeeded."))


def _validate(
    path: Path,
    set_: list[str] | None,
    set_string: list[str] | None,
    set_env: list[str] | None,
    label: list[str] | None,
    pool: str | None,
    local: bool,
) -> dict[str, Any]:
    client = _spec_server(local)
    if client is None:
        options = SpecOptions.parse(set_, set_string, set_env, label, pool)
        return _validate_locally(path, options)
    req = _server_request(path, set_, set_string, set_env, label, pool)
    answer: ValidateAnswer = client.json("POST", "/api/workflow/validate", json=req.to_json())
    return {**answer, "server": client.url, "warnings": answer.get("warnings", [])}


SpecOrIdArg = Annotated[
    str,
    typer.Argument(
        help="The workflow spec (YAML with Jinja), or the id of a submitted workflow (NAME-N).",
        metavar="SPEC|WORKFLOW_ID",
    ),
]
TemplateOpt = Annotated[
    bool,
    typer.Option("--template", help="With a workflow id: the spec as written, before rendering."),
]


@app.command(
    "spec",
    help=f"""Print the rendered spec (special tokens kept) once it validates.
{WHERE_CHECKED} --set-env and --label are checked but, like the tokens, applied when the
workflow runs: the text shows the spec as rendered. Warnings go to stderr. Given the id of a
submitted workflow (NAME-N) instead of a file, print the spec it was submitted with, as the
server stored it (rendered; with --template, as written); that asks the server like
`workflow query` does, starting the local one if none runs.""",
)
def spec_command(
    source: SpecOrIdArg,
    set_: SetOpt = None,
    set_string: SetStringOpt = None,
    set_env: SetEnvOpt = None,
    label: LabelOpt = None,
    pool: PoolOpt = None,
    local: LocalOpt = False,
    template: TemplateOpt = False,
) -> None:
    from trainyard.cli.workflow_ops import looks_like_workflow_id

    path = Path(source)
    if not path.exists() and looks_like_workflow_id(source):
        _print_text(_stored_spec(source, template))
        return
    if template:
        raise typer.BadParameter(
            "--template goes with a workflow id (NAME-N), not a spec file", param_hint="--template"
        )
    _print_text(_checked_spec(path, set_, set_string, set_env, label, pool, local))


def _stored_spec(workflow_id: str, template: bool) -> str:
    answer = Client().request(
        "GET", f"/api/workflow/{workflow_id}/spec", params={"template": template}
    )
    return answer.text


def _print_text(text: str) -> None:
    typer.echo(text, nl=not text.endswith("\n"))


def _checked_spec(
    path: Path,
    set_: list[str] | None,
    set_string: list[str] | None,
    set_env: list[str] | None,
    label: list[str] | None,
    pool: str | None,
    local: bool,
) -> str:
    """The rendered text of the spec file once it validates (its warnings printed)."""
    client = _spec_server(local)
    if client is None:
        options = SpecOptions.parse(set_, set_string, set_env, label, pool)
        rendered = _render(path, options)
        warnings = _parse(rendered, path, options).warnings
    else:
        req = _server_request(path, set_, set_string, set_env, label, pool)
        answer = client.json(
            "POST", "/api/workflow/spec", params={"format": "json"}, json=req.to_json()
        )
        rendered, warnings = answer["spec"], spec_warnings(answer)
    print_spec_warnings(warnings)
    return rendered


@app.command("schema")
def schema_command() -> None:
    """Print a JSON Schema of the workflow language (YAML keys), for editors."""
    typer.echo(json.dumps(spec.json_schema(), indent=2))


VERBS: dict[str, dict[str, str]] = {
    "Run": {
        "submit": "Submit a spec; --wait follows it to its end.",
        "restart": "Run a failed workflow's failed groups again.",
        "validate": "Check a spec; print every problem.",
        "spec": "Print a spec rendered, or a workflow's stored spec.",
        "schema": "Print the spec language's JSON Schema, for editors.",
    },
    "Watch": {
        "logs": "Print (and follow) a workflow's task logs.",
        "events": "Show every transition of each task attempt.",
        "query": "Show a workflow's tasks, and why it waits or failed.",
        "list": "List workflows (-a: everyone's).",
        "metrics": "CPU, memory and GPU use, training curves per task.",
        "diff": "Compare two workflows: settings, metrics, models.",
    },
    "Manage": {
        "cancel": "Cancel workflows.",
        "tag": "Change or list workflow tags.",
        "delete": "Delete ended workflows and their run folders.",
        "prune": "Delete your workflows that ended long ago.",
    },
    "Reach a running task": {
        "exec": "Run a command inside a running task.",
        "port-forward": "Forward a local port to a running task.",
        "rsync": "Copy files into or out of a running task.",
    },
}
"""``workflow --help``: the verbs in groups, OSMO's order inside each (``osmo workflow``'s,
shared/osmo-cli.txt: submit, restart, validate, logs, events, cancel, query, list, tag, exec,
spec, port-forward, rsync), trainyard's own beside their kin; one short line each, the
details in each verb's own ``--help``."""


def _group_verbs(typer_app: typer.Typer) -> None:
    """Give each registered verb its group and short line, and list them in ``VERBS``'
    order (a verb not in it keeps its place, after them)."""
    place = {
        verb: (panel, index)
        for index, (panel, verb) in enumerate(
            (panel, verb) for panel, verbs in VERBS.items() for verb in verbs
        )
    }

    def name_of(info: Any) -> str:
        return info.name or (info.callback.__name__ if info.callback else "")

    for info in typer_app.registered_commands:
        if name_of(info) in place:
            panel, _ = place[name_of(info)]
            info.rich_help_panel, info.short_help = panel, VERBS[panel][name_of(info)]
    typer_app.registered_commands.sort(
        key=lambda info: place.get(name_of(info), ("", len(place)))[1]
    )


def _register_server_commands() -> None:
    from trainyard.cli import (
        workflow_control,
        workflow_diff,
        workflow_interactive,
        workflow_metrics,
        workflow_ops,
        workflow_query,
    )

    workflow_ops.register(app)
    workflow_query.register(app)
    workflow_control.register(app)
    workflow_metrics.register(app)
    workflow_diff.register(app)
    workflow_interactive.register(app)
    _group_verbs(app)


_register_server_commands()
