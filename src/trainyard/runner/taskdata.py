"""The data one attempt moves: inputs downloaded, outputs uploaded, each URL checked against
the pool's data roots (``trainyard.dataroots``) just before, through the data layer's hook
(``trainyard.data.runnerhook``), loaded only when a task moves data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard import dataroots
from trainyard.data.runnerhook import DataHook, load_data_hook
from trainyard.data.scrub import scrub
from trainyard.errors import DataError
from trainyard.runfile import TaskRun
from trainyard.runner.failures import StepFailed
from trainyard.runner.taskpaths import TaskPaths
from trainyard.status import ExitCode

if TYPE_CHECKING:
    from trainyard.data.config import DataConfig

__all__ = ["TaskData", "data_config_with"]


class TaskData:
    """Moves an attempt's inputs and outputs.

    Args:
        run: the attempt.
        paths: its text and path rules (storage URLs' tokens).
        say: writes one runner line to the task log.
        hook: the data layer (default: loaded on first use).
    """

    def __init__(
        self,
        run: TaskRun,
        paths: TaskPaths,
        say: Callable[[str], None],
        hook: DataHook | None = None,
    ) -> None:
        self.run = run
        self.paths = paths
        self.say = say
        self._hook = hook
        self._data_hooks: dict[str, DataHook] = {}

    @property
    def hook(self) -> DataHook:
        """The data layer, loaded on first use: a task that moves no data never imports it."""
        if self._hook is None:
            self._hook = load_data_hook(self.say)
            if self.run.user is not None and hasattr(self._hook, "actor"):
                from trainyard.data.datasets import Actor  # the data layer, when present

                self._hook.actor = Actor(self.run.user)
        return self._hook

    def hook_for(self, url: str) -> DataHook:
        """The data hook for ``url``: with the submitter's DATA credential whose endpoint
        starts it (the longest), its keys, region and ``override_url`` (OSMO's "Data"
        credentials), else ``hook``."""
        match = next(
            (d for d in self.run.data_credentials if url.startswith(d.get("endpoint", "\0"))), None
        )
        if match is None:
            return self.hook
        endpoint = match["endpoint"]
        if endpoint not in self._data_hooks:
            from trainyard.data.hook import DataLayerHook  # the data layer, on use

            hook = DataLayerHook(self.say, config=data_config_with(match))
            if self.run.user is not None:
                from trainyard.data.datasets import Actor

                hook.actor = Actor(self.run.user)
            self._data_hooks[endpoint] = hook
        return self._data_hooks[endpoint]

    def url_problem(self, url: str) -> str | None:
        """Why ``url`` may not be used (``trainyard.dataroots``), None when it may; symlinks
        are resolved now, just before the transfer."""
        if self.run.data_roots is None:
            return None
        home = Path(self.run.data_home or "/nonexistent-trainyard-home")
        return dataroots.url_problem(url, self.run.data_roots, home)

    def check_url(self, url: str, code: int, what: str) -> None:
        """Raise StepFailed(``code``) when ``url`` is outside the pool's data roots."""
        problem = self.url_problem(url)
        if problem:
            raise StepFailed(code, f"{what}: refused: {problem}")

    def checkpoint_allowed(self, url: str) -> bool:
        """For a checkpoint (which never fails the task): logs and skips a refused URL."""
        problem = self.url_problem(self.paths.storage_url(url))
        if problem:
            self.say(f"checkpoint to {scrub(url)} refused: {problem}")
        return problem is None

    def download_inputs(self) -> None:
        """Fetch every input into its folder. Raises StepFailed(2010)."""
        for index, item in enumerate(self.run.inputs):
            dest = self.run.input_path(index)
            if item.unavailable is not None:
                raise StepFailed(
                    ExitCode.DOWNLOAD_FAILED,
                    f"input {index} ({item.kind} {item.name}): {item.unavailable}",
                )
            if item.kind == "url":
                item = item.model_copy(update={"source": self.paths.storage_url(item.source)})
                self.check_url(item.source, ExitCode.DOWNLOAD_FAILED, f"input {index}")
            try:
                hook = self.hook_for(item.source) if item.kind == "url" else self.hook
                count = hook.download(item, dest)
            except DataError as exc:
                raise StepFailed(ExitCode.DOWNLOAD_FAILED, f"input {index}: {exc}") from exc
            line = f"input {index} ({item.kind} {item.name}): {count} file(s) in {dest}"
            self.say(scrub(line))

    def upload_outputs(self) -> None:
        """Upload the output folder to every output. Raises StepFailed(2012)."""
        for target in self.run.outputs:
            if target.url is not None:
                url = self.paths.storage_url(target.url)
                target = target.model_copy(update={"url": url})
                self.check_url(url, ExitCode.UPLOAD_FAILED, "output")
            where = scrub(target.url or (target.dataset.name if target.dataset else "?"))
            try:
                hook = self.hook_for(target.url) if target.url else self.hook
                count = hook.upload(self.run.output_path, target)
            except DataError as exc:
                raise StepFailed(ExitCode.UPLOAD_FAILED, f"output to {where}: {exc}") from exc
            self.say(f"output: {count} file(s) uploaded to {where}")


def data_config_with(payload: dict[str, str]) -> DataConfig:
    """The data settings (``trainyard.data.config``) with a DATA credential's keys for S3:
    ``access_key_id``/``access_key`` as fsspec's ``key``/``secret``, ``region`` as the
    client's region, ``override_url`` (an S3-compatible store) as the endpoint."""
    import dataclasses

    from trainyard.data.config import load_config

    config = load_config()
    s3 = dict(config.storage_options.get("s3", {}))
    s3.update(key=payload["access_key_id"], secret=payload["access_key"])
    if payload.get("region"):
        s3["client_kwargs"] = {**s3.get("client_kwargs", {}), "region_name": payload["region"]}
    options = {**config.storage_options, "s3": s3, "s3a": s3}
    return dataclasses.replace(
        config,
        storage_options=options,
        s3_endpoint_url=payload.get("override_url") or config.s3_endpoint_url,
    )
