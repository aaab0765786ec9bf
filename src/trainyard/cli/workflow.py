"""``trainyard workflow``: validate a spec, show it rendered, print the language's schema.

Thin: each command turns its options into arguments of ``trainyard.spec`` and prints.
Errors are raised, never printed here (``cli.main`` prints them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from trainyard import spec
from trainyard.pools import Pool, get_pool

__all__ = ["app", "SpecOptions"]

app = typer.Typer(help="Submit, watch and manage workflows; validate and render specs.",
                 no_args_is_help=True)

SpecArg = Annotated[Path, typer.Argument(help="The workflow spec (YAML with Jinja).", metavar="SPEC")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", metavar="NAME=VALUE",
    help="Template value, YAML-typed (int, float, bool, string). Several pairs may follow one flag.")]
SetStringOpt = Annotated[list[str] | None, typer.Option(
    "--set-string", metavar="NAME=VALUE", help="Template value kept as a string; wins over --set.")]
SetEnvOpt = Annotated[list[str] | None, typer.Option(
    "--set-env", metavar="NAME=VALUE", help="Environment variable added to every task.")]
LabelOpt = Annotated[list[str] | None, typer.Option(
    "--label", metavar="KEY=VALUE", help="Workflow label; overrides the spec's.")]
PoolOpt = Annotated[str | None, typer.Option(
    "--pool", help="Pool to check against (default: the spec's pool, else 'local').")]


@dataclass(frozen=True)
class SpecOptions:
    """The options every spec command takes, parsed."""

    set_values: dict[str, Any]
    set_strings: dict[str, str]
    set_env: dict[str, str]
    labels: dict[str, str]
    pool: str | None

    @classmethod
    def parse(cls, set_: list[str] | None, set_string: list[str] | None,
              set_env: list[str] | None, label: list[str] | None, pool: str | None) -> SpecOptions:
        """Parse the raw ``NAME=VALUE`` lists (raises ``SpecError`` on a malformed pair)."""
        return cls(spec.parse_set_values(set_ or []), spec.parse_set_strings(set_string or []),
                   spec.parse_env(set_env or []), spec.parse_labels(label or []), pool)

    def choose_pool(self, spec_pool: str | None) -> Pool:
        """``--pool``, else the spec's ``workflow.pool``, else ``local`` (from pools.yaml)."""
        return get_pool(self.pool or spec_pool)


def _render(path: Path, options: SpecOptions) -> str:
    return spec.render_source(path, set_values=options.set_values, set_strings=options.set_strings)


def _parse(rendered: str, path: Path, options: SpecOptions) -> spec.SpecDocument:
    return spec.parse(rendered, spec_path=path, set_env=options.set_env, labels=options.labels,
                      pool=options.choose_pool)


@app.command("validate")
def validate_command(path: SpecArg, set_: SetOpt = None, set_string: SetStringOpt = None,
                     set_env: SetEnvOpt = None, label: LabelOpt = None, pool: PoolOpt = None) -> None:
    """Render and check a spec; print every problem (exit 2) or success (exit 0)."""
    options = SpecOptions.parse(set_, set_string, set_env, label, pool)
    _parse(_render(path, options), path, options)
    typer.echo("Workflow validation succeeded.")


@app.command("spec")
def spec_command(path: SpecArg, set_: SetOpt = None, set_string: SetStringOpt = None,
                 set_env: SetEnvOpt = None, label: LabelOpt = None, pool: PoolOpt = None) -> None:
    """Print the rendered spec (special tokens kept) once it validates.

    --set-env and --label are checked but, like the tokens, applied when the workflow runs:
    the text shows the spec as rendered.
    """
    options = SpecOptions.parse(set_, set_string, set_env, label, pool)
    rendered = _render(path, options)
    _parse(rendered, path, options)
    typer.echo(rendered, nl=not rendered.endswith("\n"))


@app.command("schema")
def schema_command() -> None:
    """Print a JSON Schema of the workflow language (YAML keys), for editors."""
    typer.echo(json.dumps(spec.json_schema(), indent=2))


def _register_server_commands() -> None:
    from trainyard.cli import workflow_ops

    workflow_ops.register(app)


_register_server_commands()
