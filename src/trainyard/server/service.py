"""The service facade: what the REST API (and tests) call, for one engine. No HTTP here.

``Service`` holds one object per subject, each with its own module: ``pools``
(``ServedPools``), ``submissions`` (specs in), ``reads`` (workflows out), ``control``
(changes), ``logs`` and ``credentials``. Who may see what: ``ownership``. The design is in
docs/server.md.
"""

from __future__ import annotations

from pathlib import Path

from trainyard.engine.reconciler import Engine
from trainyard.server.ownership import task_token_owner
from trainyard.server.served_pools import ServedPools
from trainyard.server.submissions import Submissions
from trainyard.server.user_credentials import UserCredentials
from trainyard.server.workflow_control import WorkflowControl
from trainyard.server.workflow_logs import WorkflowLogs
from trainyard.server.workflow_reads import WorkflowReads

__all__ = ["Service"]


class Service:
    """Operations of the API, for one engine, by subject."""

    def __init__(
        self,
        engine: Engine,
        *,
        refused_pools: dict[str, str] | None = None,
        pools_file: Path | None = None,
    ) -> None:
        """Args:
        refused_pools: pools of pools.yaml not served (backend not available), with the
            reason.
        pools_file: the ``pools.yaml`` the engine's pools came from; given, it is read
            again whenever its modification time changes (``ServedPools.refresh``).
            None: the pools never change.
        """
        self.engine = engine
        self.pools = ServedPools(engine, refused=refused_pools, pools_file=pools_file)
        self.submissions = Submissions(engine, self.pools)
        self.reads = WorkflowReads(engine)
        self.control = WorkflowControl(engine)
        self.logs = WorkflowLogs(engine)
        self.credentials = UserCredentials(engine)

    def task_token_owner(self, workflow_id: str) -> str:
        """The submitter a task token of ``workflow_id`` acts as (``ownership.task_token_owner``).

        Raises:
            AuthError: the workflow is unknown or has ended (its tasks' tokens expire with it).
        """
        return task_token_owner(self.engine.store, workflow_id)
