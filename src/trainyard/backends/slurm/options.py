"""The Slurm backend's pool options (``pools.yaml``: ``options:`` of a ``backend: slurm`` pool).

``partition``, ``account``, ``qos`` (sbatch's flags), ``container`` (``apptainer``: each task's
image runs with ``apptainer exec IMAGE``) and ``container_args``, ``sbatch_args`` and
``srun_args`` (extra flags, as given), ``requests`` (resources Slurm is asked for),
``python`` (trainyard's interpreter on the nodes), ``slurm_conf`` (``SLURM_CONF`` for every
Slurm command). An example: docs/pools.md, "Slurm pool options, an example".
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from trainyard.backends.base import parse_pool_options

__all__ = ["SlurmOptions", "parse_options"]

Word = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.,:+@=-]+$")]
"""A value that goes on an ``#SBATCH`` line as it is: no spaces, quotes or backslashes."""


_ALL_REQUESTS: tuple[Literal["cpu", "memory", "gpu"], ...] = ("cpu", "memory", "gpu")


class SlurmOptions(BaseModel):
    """A Slurm pool's options; every field is optional.

    Attributes:
        partition, account, qos: sbatch(1) ``--partition``, ``--account``, ``--qos``.
        container: ``apptainer`` (or ``singularity``): the task's command runs through
            ``<container> exec [container_args] IMAGE``; None: on the node's own tools.
        container_args: flags after ``<container> exec`` (``--nv`` for GPUs ...).
        image_prefix: put before an image that has no ``scheme://`` and is not a path.
        sbatch_args: extra sbatch flags, passed on sbatch's command line as given.
        srun_args: extra flags for every ``srun`` step.
        python: the interpreter that runs ``trainyard.runner`` on the nodes (default: the
            engine's own, which must then be on the shared filesystem).
        slurm_conf: ``SLURM_CONF`` for every Slurm command trainyard runs (default: the
            environment's, else Slurm's built-in path).
        requests: which of a task's resources become Slurm requests (default all three);
            a CPU-only rehearsal cluster standing in for GPU nodes drops ``gpu`` (and
            ``cpu`` where tasks ask for more cores than its nodes have).
        mixed_resources: a gang whose tasks ask for different resources becomes a
            heterogeneous job (``hetjob``, one component per task) or one job that gives each
            node the largest request (``max``).
        time_margin_s: ``--time`` is the workflow's exec timeout plus this margin (the
            engine's exec timeout rule ends the group first; Slurm's limit is a backstop).
        status_interval_s: squeue is asked at most this often.
        lost_grace_s: an attempt whose job or step ended without an EXITED event is LOST
            only after this long (the runner's last event may still be on its way).
        allowed_data_roots: host folders ``file://`` URLs may use (a path or a list): an
            option of every pool, read by the engine and the runner (``trainyard.dataroots``),
            not by this backend; listed here so that a Slurm pool may set it.
    """

    model_config = ConfigDict(extra="forbid")

    partition: Word | None = None
    account: Word | None = None
    qos: Word | None = None
    container: Literal["apptainer", "singularity"] | None = None
    container_args: list[str] = Field(default_factory=list)
    image_prefix: str = "docker://"
    sbatch_args: list[str] = Field(default_factory=list)
    srun_args: list[str] = Field(default_factory=list)
    python: str | None = None
    slurm_conf: str | None = None
    requests: list[Literal["cpu", "memory", "gpu"]] = Field(
        default_factory=lambda: list(_ALL_REQUESTS)
    )
    mixed_resources: Literal["hetjob", "max"] = "hetjob"
    time_margin_s: float = Field(default=600.0, ge=0)
    status_interval_s: float = Field(default=1.0, gt=0)
    lost_grace_s: float = Field(default=3.0, ge=0)
    allowed_data_roots: list[str] | str | None = None


def parse_options(pool_name: str, options: dict[str, Any]) -> SlurmOptions:
    """Validate a pool's ``options``.

    Raises:
        ConfigError: an unknown option or a bad value; the message names the pool and
            lists the valid options.
    """
    return parse_pool_options(SlurmOptions, pool_name, "slurm", options)
