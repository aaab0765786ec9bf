"""runner layer: the task runner that wraps the user command on every backend
(data in, files, barrier, command, checkpoints, data out, exit code). See ../shared/DESIGN.md.

Entry point: ``python -m trainyard.runner RUN_JSON`` (``RUN_JSON``: a ``trainyard.runfile.TaskRun``).
"""
