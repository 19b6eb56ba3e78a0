"""The rollout without its turn barrier (`rollout.turn_barrier=false`): each agent asks for its next reply
as soon as its own env step returns, and each engine call serves every agent waiting at that moment, so a
slow env holds only its own agent."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from grl.engines.base import SamplingParams
from grl.rollout.env_pool import CallPool
from grl.rollout.slot import Slot

if TYPE_CHECKING:
    from grl.rollout.multi_turn import MultiTurnRollout

# Env steps that return within this many seconds of each other share an engine call.
GATHER_S = 0.01


def play_without_barrier(
    rollout: MultiTurnRollout,
    slots: list[Slot],
    sampling: SamplingParams,
    on_turn: Callable[[int, int, int], None] | None,
) -> None:
    """Every agent moves on when its own env step returns: an engine call serves all agents that
    are waiting for a reply, whatever their turn, while the env steps of the others run. A request's
    seed is its agent's and turn's (`seed + 1009 * turn + agent`), not its place in a batch, so the
    replies do not depend on which agents happened to be waiting together."""
    index = {id(s): i for i, s in enumerate(slots)}

    def params(call: int, limit: int, group: list[Slot]) -> SamplingParams:
        seeds = (
            None
            if sampling.seed is None
            else [sampling.seed + 1009 * len(s.turns) + index[id(s)] for s in group]
        )
        return replace(sampling, max_new_tokens=limit, seed=None, request_seeds=seeds)

    pool = CallPool(rollout.env_workers, rollout.env_step_timeout)
    waiting = [s for s in slots if not s.done]
    try:
        while waiting or pool.pending:
            if waiting:
                if on_turn is not None:
                    on_turn(min(len(s.turns) for s in waiting), sum(not s.done for s in slots), len(slots))
                for s, reply in zip(*rollout._generate(slots, waiting, params)):
                    pool.submit(
                        index[id(s)],
                        rollout.clock.env_call(s.task.name, lambda s=s, r=reply: s.agent.step(r)),
                    )
                waiting = []
            with rollout.clock.waiting("gen_env"):
                returned = pool.collect(wait=1.0)
                while returned and (
                    more := pool.collect(wait=GATHER_S)
                ):  # steps that end together share a call
                    returned += more
            for i, result in returned:
                rollout._after_step(slots[i], result)
                if not slots[i].done:
                    waiting.append(slots[i])
            rollout.faults.check(slots)
    finally:
        pool.close()
