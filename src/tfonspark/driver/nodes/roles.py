"""Role planning and cluster specs: pure functions, tested without Spark.

A node's ``TF_CONFIG`` is written beside its reader, in :mod:`tfonspark.distribute.tf_config`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...errors import ConfigError

__all__ = [
    "CHIEF_ROLES",
    "DATA_ROLES",
    "SERVICE_ROLES",
    "NodeRole",
    "build_cluster_spec",
    "plan_roles",
]

CHIEF_ROLES = ("chief", "master")
#: Roles that receive fed data and whose completion ends training (unless they only serve: ``NodeRole.serves``).
DATA_ROLES = ("chief", "master", "worker")
#: Roles that serve until the cluster shuts down (``server.join()``).
SERVICE_ROLES = ("ps", "evaluator")


@dataclass(frozen=True)
class NodeRole:
    """The TensorFlow role of one executor slot."""

    executor_id: int
    job_name: str
    task_index: int
    on_driver: bool = False
    #: runs only a TF server for the chief's coordinator (``run(..., coordinator=True)``): no user
    #: code, so it never ends by itself and is stopped with the ps once the chief is done (the
    #: evaluator of such a cluster runs ``map_fun``, a sidecar evaluator, and is stopped then too)
    serves: bool = False

    @property
    def name(self) -> str:
        return f"{self.job_name}:{self.task_index}"

    @property
    def trains(self) -> bool:
        """Whether the cluster's work is done only when this node exits (a chief or worker running ``map_fun``)."""
        return self.job_name in DATA_ROLES and not self.serves


def plan_roles(
    num_executors: int,
    num_ps: int = 0,
    master_node: str | None = None,
    eval_node: bool = False,
    driver_ps_nodes: bool = False,
    coordinator: bool = False,
) -> list[NodeRole]:
    """Assign roles to executor ids 0..n-1 in TFoS order: ps, chief/master, evaluator, workers.

    ``coordinator``: the chief is ``ParameterServerStrategy``'s coordinator and every other node
    only ``serves`` (``run(..., coordinator=True)``), except the ``eval_node`` evaluator, which runs
    ``map_fun`` beside them (a sidecar evaluator); there must be a ps, a chief and a worker.
    """
    _check_plan_args(num_executors, num_ps, master_node, eval_node)
    if coordinator:
        master_node = _check_coordinator(num_executors, num_ps, master_node, eval_node)
    jobs = ["ps"] * num_ps
    if master_node:
        jobs.append(master_node)
    if eval_node:
        jobs.append("evaluator")
    jobs += ["worker"] * (num_executors - len(jobs))
    roles: list[NodeRole] = []
    counts: dict[str, int] = {}
    for executor_id, job in enumerate(jobs):
        index = counts.get(job, 0)
        counts[job] = index + 1
        serves = coordinator and job not in ("chief", "evaluator")
        roles.append(NodeRole(executor_id, job, index, on_driver=driver_ps_nodes and job == "ps", serves=serves))
    return roles


def _check_coordinator(num_executors: int, num_ps: int, master_node: str | None, eval_node: bool) -> str:
    """The chief's job name for ``coordinator=True`` ("chief", as TF's coordinator needs), or a ConfigError."""
    given = f"coordinator=True, num_executors={num_executors}, num_ps={num_ps}, eval_node={eval_node}"
    if num_ps < 1:
        raise ConfigError(f"coordinator=True needs num_ps >= 1 (ParameterServerStrategy). Received: {given}")
    if num_executors - num_ps - int(eval_node) < 2:
        needs = "num_ps + 3 with eval_node" if eval_node else "num_ps + 2"
        raise ConfigError(
            f"coordinator=True needs a chief and at least one worker besides the ps: num_executors >= {needs}. "
            f"Received: {given}"
        )
    if master_node not in (None, "chief"):
        raise ConfigError(
            f"coordinator=True runs the coordinator as task 'chief'. Received: master_node={master_node!r}"
        )
    return "chief"


def _check_plan_args(num_executors: int, num_ps: int, master_node: str | None, eval_node: bool) -> None:
    if not isinstance(num_executors, int) or num_executors < 1:
        raise ConfigError(f"num_executors must be a positive integer. Received: {num_executors!r}")
    if not isinstance(num_ps, int) or num_ps < 0:
        raise ConfigError(f"num_ps must be a non-negative integer. Received: {num_ps!r}")
    if master_node is not None and master_node not in CHIEF_ROLES:
        raise ConfigError(f"master_node must be one of {CHIEF_ROLES} or None. Received: {master_node!r}")
    trainers = num_executors - num_ps - int(eval_node)
    if trainers < 1:
        raise ConfigError(
            f"no executor left for a chief or worker: num_executors={num_executors}, "
            f"num_ps={num_ps}, eval_node={eval_node}; raise num_executors or lower num_ps"
        )


def build_cluster_spec(
    roles: Sequence[NodeRole], addresses: Mapping[int, str], fixed: Mapping[str, Sequence[str]] | None = None
) -> dict[str, list[str]]:
    """``{job: [host:port, ...]}`` ordered by task index, from each executor's reserved address.

    ``fixed`` adds tasks no node runs, at addresses known beforehand: ``{"chief": ["driver:port"]}``
    for the driver of :func:`tfonspark.ps_cluster`, which holds that task itself.
    """
    missing = [r.executor_id for r in roles if r.executor_id not in addresses]
    if missing:
        raise ConfigError(f"no address registered for executor ids {missing}")
    clash = sorted(set(fixed or {}) & {r.job_name for r in roles})
    if clash:
        raise ConfigError(f"jobs {clash} are both run by nodes and fixed: {dict(fixed or {})}")
    spec: dict[str, list[str]] = {job: list(hosts) for job, hosts in (fixed or {}).items()}
    for role in sorted(roles, key=lambda r: (r.job_name, r.task_index)):
        spec.setdefault(role.job_name, []).append(addresses[role.executor_id])
    return spec
