"""Fault-aware dispatch of a worker group's calls: results gathered in rank order, and a rank's death
(or its node's) named in one line as soon as Ray reports it, not as the broken collective it leaves."""

from __future__ import annotations

import logging
import time

from grl.errors import first_line
from grl.workers.runtime import WorkerDiedError

log = logging.getLogger("grl.workers")

# A rank whose peer's process is gone fails in its collective (gloo: connection closed) about a second
# before Ray reports the peer itself: the death, not the broken collective, is what the error names.
PEER_DEATH_GRACE_S = 5


class FaultAwareDispatch:
    """What a worker group (grl/workers/group.py) needs of itself: `role`, `nodes` (the Ray node id of
    each rank) and `_abandoned` (results of peers of a failed rank, collected at shutdown)."""

    role: str
    nodes: list[str]
    _abandoned: list

    def _gather(self, refs: list, ranks: list[int]) -> list:
        """Results in rank order. Returns as soon as any rank fails, so a dead
        rank never leaves the driver waiting on its peers' collectives."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        where = {ref: i for i, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = where[ready[0]]
            try:
                results[i] = ray.get(ready[0])
            except RayActorError as err:
                self._abandoned += pending
                raise self._died(ranks[i], err) from err
            except RayTaskError as err:
                self._abandoned += pending
                died = self._peer_death(pending, where, ranks)
                if died is not None:
                    raise died from err
                raise
            except BaseException:
                self._abandoned += pending
                raise
        return results

    def _peer_death(self, pending: list, where: dict, ranks: list[int]) -> WorkerDiedError | None:
        """The death of one of the ranks still `pending`, if Ray reports one within PEER_DEATH_GRACE_S."""
        import ray
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + PEER_DEATH_GRACE_S
        while pending and (left := deadline - time.monotonic()) > 0:
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in ready:
                try:
                    ray.get(ref)
                except RayActorError as err:
                    return self._died(ranks[where[ref]], err)
                except Exception as err:  # noqa: BLE001 - another rank's share of the same failure
                    log.debug("peer of a failed rank: %s", first_line(err))
        return None

    def _died(self, rank: int, err) -> WorkerDiedError:
        """One line for a dead rank, naming its node (IP and id) when Ray reports the node dead."""
        import ray
        from ray.exceptions import ActorUnavailableError

        from grl.workers.runtime import node_death_wait_s

        name = f"{self.role} rank {rank}"
        # A lost connection to a rank on another node is how that node's death first shows; Ray marks the
        # node dead only once its health checks have failed, so wait for that verdict (bounded by how long
        # the checks take). The driver's own node cannot be dead while the driver runs: no wait on one node.
        remote = rank < len(self.nodes) and self.nodes[rank] != ray.get_runtime_context().get_node_id()
        node = self._dead_node(
            rank, node_death_wait_s() if remote and isinstance(err, ActorUnavailableError) else 0.0
        )
        if node is None:
            return WorkerDiedError(f"{name} died: {first_line(err)}", worker=name)
        ip, node_id, reason = node
        because = f" ({reason.strip().splitlines()[0]})" if reason.strip() else ""
        return WorkerDiedError(
            f"{name} died: its node {ip} (node id {node_id}) died{because}", worker=name, node=(ip, node_id)
        )

    def _dead_node(self, rank: int, wait_s: float) -> tuple[str, str, str] | None:
        """(IP, node id, Ray's reason) of the node `rank` ran on, once Ray has marked it dead; None if it
        is alive after `wait_s` seconds, or the rank's node is not known (it died while the group formed)."""
        import ray

        if rank >= len(self.nodes):
            return None
        node_id, deadline = self.nodes[rank], time.monotonic() + wait_s
        while True:
            for node in ray.nodes():
                if node["NodeID"] == node_id and not node["Alive"]:
                    return node["NodeManagerAddress"], node_id, node.get("DeathReasonMessage", "")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.5)


def stop_ranks(workers: list, abandoned: list, timeout: float) -> None:
    """Ask every rank to tear down, give them `timeout` seconds, then kill them; and collect what a failed
    call's other ranks left (`abandoned`), so that Ray does not report those errors as unhandled when the
    references go away."""
    import ray

    refs = []
    for w in workers:
        try:
            refs.append(w.teardown.remote())
        except Exception as err:  # noqa: BLE001 - the actor may be gone already
            log.debug("teardown: %s", err)
    if refs and timeout > 0:
        ray.wait(refs, num_returns=len(refs), timeout=timeout)
    for w in workers:
        try:
            ray.kill(w)
        except Exception as err:  # noqa: BLE001
            log.debug("kill: %s", err)
    for ref in abandoned:
        try:
            ray.get(ref, timeout=timeout)
        except Exception as err:  # noqa: BLE001
            log.debug("abandoned call: %s", first_line(err))
