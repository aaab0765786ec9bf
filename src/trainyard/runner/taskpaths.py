"""Where a spec's paths and text land for one attempt: ``/tmp`` and private paths rewritten
under ``sandbox.root`` when the backend gave no private ``/``, special tokens
(``trainyard.spec.tokens``) resolved, spec paths mapped to this process's own."""

from __future__ import annotations

from pathlib import Path

from trainyard.runfile import TaskRun
from trainyard.runner.text import PathRewriter
from trainyard.spec.tokens import substitute_tokens, token_values

__all__ = ["TaskPaths"]


class TaskPaths:
    """The text and path rules of one attempt; ``run.hosts`` must be set already.

    Args:
        run: the attempt.
    """

    def __init__(self, run: TaskRun) -> None:
        self.run = run
        self.rewriter = self._rewriter()
        self.tokens = token_values(
            [i.name if i.kind == "task" else None for i in run.inputs],
            input_dirs=[str(run.input_path(n)) for n in range(len(run.inputs))],
            output_dir=str(run.output_dir),
            workflow_id=run.workflow_id,
            hosts=run.hosts,
        )

    def _rewriter(self) -> PathRewriter | None:
        """Without a private ``/``: what moves under ``sandbox.root``: ``/tmp``, every file's
        own path, and top-level folders of files and checkpoints that the host lacks."""
        root = self.run.sandbox.root
        if not root:
            return None
        files = [f.path for f in self.run.files if f.path.startswith("/")]
        files += [c.path for c in self.run.credentials if c.path is not None]
        paths = files + [c.path for c in self.run.checkpoints if c.path.startswith("/")]
        tops = {"/" + Path(p).parts[1] for p in paths if len(Path(p).parts) > 1}
        return PathRewriter(root, {"/tmp", *files, *(t for t in tops if not Path(t).exists())})

    def prepare(self, text: str) -> str:
        """Rewrite private paths (no private ``/``) and resolve special tokens in ``text``."""
        if self.rewriter is not None:
            text = self.rewriter.rewrite(text)
        return substitute_tokens(text, self.tokens)

    def storage_url(self, url: str) -> str:
        """A storage URL with its special tokens resolved (``{{workflow_id}}``); never
        path-rewritten: it names storage outside the task."""
        return substitute_tokens(url, self.tokens)

    def cwd(self) -> str:
        """The command's working directory: ``/``, or the private root without one (with
        ``mounts`` the sandbox prefix sets ``/`` inside; the prefix starts in the run folder)."""
        if self.run.sandbox.mounts:
            return self.run.run_dir
        return self.run.sandbox.root or "/"

    def local_path(self, path: str) -> Path:
        """Where a spec path (absolute, or relative to the working directory ``/``) is for
        this process: the same path, its place under the private root, or (``mounts``) the
        host path the sandbox shows there."""
        mounts = self.run.sandbox
        if mounts.mounts:
            return Path(mounts.host_path(path if path.startswith("/") else f"/{path}"))
        if self.rewriter is None:
            return Path("/", path)
        if path.startswith("/"):
            return Path(self.rewriter.rewrite(path))
        return Path(self.rewriter.place(path))
