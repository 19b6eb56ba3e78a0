"""The multi-turn rollout: many agents, several tasks, turn by turn or each at its own pace.

Per task, `num_groups` x `group_size` agents; the agents of a group share one
seed (`base_seed + group_id`, group ids numbered across all tasks of the
call), so a group's episodes are attempts at the same puzzle. Every turn the
prompts of the agents still playing go to the engine in one call per
distinct token limit (finished agents leave the batch), the sampled ids are
decoded for `agent.step`, and the env steps run in a thread pool under
`env_step_timeout`. Without the turn barrier (`rollout.turn_barrier=false`) an
agent asks for its next reply as soon as its own env step returns, and each
engine call serves every agent waiting at that moment.

Token bookkeeping (see grl/rollout/chat.py): an episode's ids are turn 1's
prompt and reply, then for each later turn the template/env ids and the reply.
The engine's prompt at turn k is exactly those ids so far, left-truncated to
`max_prompt_length` keeping the system prompt. A task with
`agent_config.max_context_window` k >= 0 instead prompts every turn afresh with
the agent's windowed chat (the instructions, the last k turns, the current
state): that turn's `prompt_ids` are the whole prompt (`Turn.new_context`), and
the batch lets each turn attend only to its own prompt.

Env faults (an env that raises, hangs or returns a bad value) end only that agent's episode, unless
too many fail: grl/rollout/env_faults.py.

Use: `MultiTurnRollout.from_config(run.rollout, run.data, run.tools, engine,
tokenizer).run(task_specs(run.rollout,
run.tasks), base_seed, sampling)`, `run` a config's typed sections (grl.config.run_sections);
the trainer shapes the episodes into a batch with grl/trainer/transforms.py (`shape_batch`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from grl.engines.base import Engine, SamplingParams
from grl.engines.kept_sets import reply_sets
from grl.envs.base import fault_kind
from grl.envs.checks import EnvValueError
from grl.rollout.chat import ChatTokens, truncate_prompt
from grl.rollout.clock import RolloutClock
from grl.rollout.blame import blame_metrics, infra_failed
from grl.rollout.env_faults import EnvFaults, RolloutError, check_infra_ratio, reset_agent, retire_failed
from grl.rollout.env_pool import CallResult, run_calls
from grl.rollout.episode_stats import rollout_metrics
from grl.rollout.reply_grammars import ReplyGrammars
from grl.rollout.slot import Slot
from grl.rollout.tasks import TaskSpec, is_program_task
from grl.rollout.unbarriered import play_without_barrier
from grl.rollout.types import Episode, Turn

if TYPE_CHECKING:
    from grl.schema import Data, Rollout, Tools

log = logging.getLogger("grl.rollout")


@dataclass
class RolloutResult:
    episodes: list[Episode]
    metrics: dict[str, float]
    times: dict[str, float] = field(default_factory=dict)  # the parts of its wall time (grl/rollout/clock.py)


class MultiTurnRollout:
    """Runs agents of several tasks through their episodes against one engine.

    Agents are built once per (task block, position) and reused across calls
    (an env may load a dataset); a failed agent is replaced by a fresh one. `programs` plays the tasks
    an agent program plays (grl.gateway.ProgramRunner, built by the trainer over the same engine).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer,
        *,
        max_prompt_length: int,
        max_response_length: int,
        truncation: str = "left",
        env_workers: int = 16,
        env_step_timeout: float | None = 60.0,
        env_error_penalty: float | None = None,
        max_failed_agent_ratio: float = 0.5,
        max_infra_failed_ratio: float = 1.0,
        infra_retries: int = 0,
        chat_template_kwargs: dict | None = None,
        agent_factory: Callable | None = None,
        programs=None,
    ):
        self.engine = engine
        self.programs = programs
        self.tokenizer = tokenizer
        self.chat = ChatTokens(tokenizer, chat_template_kwargs)
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length
        self.truncation = truncation
        self.env_workers = env_workers
        self.env_step_timeout = env_step_timeout
        self.faults = EnvFaults(env_error_penalty, max_failed_agent_ratio)
        if agent_factory is None:
            from grl.agents import make_agent as agent_factory
        self.make_agent = agent_factory
        self.max_infra_failed_ratio = max_infra_failed_ratio
        self.infra_retries = infra_retries
        self._agents: dict[tuple, Any] = {}
        self.clock = RolloutClock()
        self.grammars = ReplyGrammars(self.chat, self.faults)

    @classmethod
    def from_config(
        cls,
        rollout: Rollout,
        data: Data,
        tools: Tools,
        engine: Engine,
        tokenizer,
        control: str | None = None,
        programs=None,
    ) -> MultiTurnRollout:
        """From the typed `rollout`, `data` (the lengths) and `tools` sections. `control`: a validation
        control of grl/agents/controls.py (e.g. `swap`) that builds the agents."""
        from grl.agents import make_agent
        from grl.agents.controls import VALIDATION_CONTROLS
        from grl.tools import SandboxLimits

        r = rollout
        sandbox = SandboxLimits(**asdict(tools.python))  # the limits of every tool call
        return cls(
            engine,
            tokenizer,
            max_prompt_length=data.max_prompt_length,
            max_response_length=data.max_response_length,
            truncation=r.truncation,
            env_workers=r.env_workers,
            env_step_timeout=r.env_step_timeout,
            env_error_penalty=r.env_error_penalty,
            max_failed_agent_ratio=r.max_failed_agent_ratio,
            max_infra_failed_ratio=r.max_infra_failed_ratio,
            infra_retries=r.infra_retries,
            agent_factory=lambda name, block: (VALIDATION_CONTROLS[control] if control else make_agent)(
                name, block, sandbox
            ),
            programs=programs,
        )

    # ------------------------------------------------------------ public

    def run(
        self,
        tasks: list[TaskSpec],
        base_seed: int,
        sampling: SamplingParams,
        on_turn: Callable[[int, int, int], None] | None = None,
        turn_barrier: bool = True,
    ) -> RolloutResult:
        """One rollout: every agent of every task plays one episode. `on_turn(turn,
        playing, total)` is told before each engine call how many agents still play.
        `turn_barrier=False`: each agent asks for its next reply as soon as its env step returns,
        and each engine call serves every agent that is waiting (grl/rollout/unbarriered.py).
        Program tasks (`agent_config.program`) are played after the others by `programs`."""
        programs = [task for task in tasks if is_program_task(task)]
        if programs and self.programs is None:
            raise RolloutError(
                f"{programs[0].name}: agent programs play through the trainer's gateway (none given)"
            )
        native = [task for task in tasks if not is_program_task(task)]
        self.clock = RolloutClock()
        slots = self._slots(native, base_seed)
        self._play(slots, sampling, on_turn, turn_barrier)
        retried = 0
        for _ in range(self.infra_retries):  # the same seeds again, with fresh agents, to top the batch up
            redo = [i for i, s in enumerate(slots) if infra_failed(s)]
            if not redo:
                break
            again = [
                Slot(slots[i].task, slots[i].key, slots[i].group_id, slots[i].seed, slots[i].member)
                for i in redo
            ]
            others = [s for i, s in enumerate(slots) if i not in set(redo)]
            self._play(self._with_agents(again), sampling, on_turn, turn_barrier, others)
            for i, s in zip(redo, again):
                slots[i] = s
            retried += len(redo)
        episodes = [s.episode() for s in slots]
        extra: dict[str, float] = {"rollout/infra_retried_episodes": float(retried)}
        if programs:
            first_group = sum(t.num_groups for t in native)
            with self.clock.waiting("gen_programs"):
                played, program_metrics = self.programs.run(
                    programs, base_seed, first_group, sampling, on_turn
                )
            episodes += played
            extra.update(program_metrics)
        check_infra_ratio(episodes, self.max_infra_failed_ratio)
        metrics = rollout_metrics(episodes, [s.truncated_turns for s in slots])
        return RolloutResult(episodes, {**metrics, **blame_metrics(episodes), **extra}, self.clock.times())

    def _play(
        self, slots: list[Slot], sampling, on_turn, turn_barrier: bool, others: list[Slot] = ()
    ) -> None:
        """Every slot's episode, to its end; `others`: the step's slots played before, which the failure ratio
        counts too."""
        self.faults.others = list(others)
        try:
            self._reset(slots)
            if turn_barrier:
                turn, at_once = 0, self._rows_at_once(len(slots))
                while playing := sum(not s.done for s in slots):
                    if on_turn is not None:
                        on_turn(turn, playing, len(slots))
                    self._turn(slots, turn, sampling, at_once)
                    turn += 1
            else:
                play_without_barrier(self, slots, sampling, on_turn)
        finally:
            with self.clock.waiting("gen_env"):
                retire_failed(slots, self._agents, self.env_workers, self.env_step_timeout)

    def close(self) -> None:
        if self.programs is not None:
            self.programs.close()
        agents, self._agents = list(self._agents.values()), {}
        run_calls([a.close for a in agents], self.env_workers, self.env_step_timeout)

    # ------------------------------------------------------------ steps

    def _slots(self, tasks: list[TaskSpec], base_seed: int) -> list[Slot]:
        slots, group_id = [], 0
        for task in tasks:
            block = json.dumps(asdict(task.config), sort_keys=True, default=str)
            index = 0
            for _ in range(task.num_groups):
                for member in range(task.group_size):
                    slots.append(
                        Slot(task, (task.name, block, index), group_id, base_seed + group_id, member)
                    )
                    index += 1
                group_id += 1
        return self._with_agents(slots)

    def _with_agents(self, slots: list[Slot]) -> list[Slot]:
        for s in slots:
            if s.key not in self._agents:
                self._agents[s.key] = self.make_agent(s.task.name, s.task.config)
            s.agent = self._agents[s.key]
        return slots

    def _reset(self, slots: list[Slot]) -> None:
        with self.clock.waiting("gen_env"):
            results = self._env_calls([(s, lambda s=s: reset_agent(s)) for s in slots])
        for s, result in zip(slots, results):
            if not result.ok:
                self.faults.fail(s, result.error, result.timed_out, "reset")
                continue
            if isinstance(
                err := result.value, Exception
            ):  # a bad observation, or the env's fault (reset_agent)
                said = str(err) if isinstance(err, EnvValueError) else f"{type(err).__name__}: {err}"
                self.faults.fail(s, said, False, "reset", fault_kind(err))
                continue
            self.faults.repaired(s, s.agent.env_repairs)
            self._new_context(s, result.value)
        self.faults.check(slots)

    def _rows_at_once(self, agents: int) -> int | None:
        """As many agents as the engine's cache holds at their longest (the rest wait for one to finish, as
        requests wait in vLLM's scheduler); None: all of them."""
        at_once = self.engine.rows_within(self.max_prompt_length + self.max_response_length)
        if at_once is not None and at_once < agents:
            log.info("the engine's kv_cache_gb holds %d of %d agents at once; the rest wait", at_once, agents)
        return at_once

    def _turn(self, slots: list[Slot], turn: int, sampling: SamplingParams, at_once: int | None) -> None:
        """One turn of the agents still playing (the first `at_once`): one engine call per token limit, then
        every env step."""

        def params(call: int, limit: int, group: list[Slot]) -> SamplingParams:
            return replace(
                sampling,
                max_new_tokens=limit,
                seed=None if sampling.seed is None else sampling.seed + 1009 * turn + call,
            )

        active, replies = self._generate(slots, [s for s in slots if not s.done][:at_once], params)
        with self.clock.waiting("gen_env"):
            results = self._env_calls(
                [(s, lambda s=s, r=r: s.agent.step(r)) for s, r in zip(active, replies)]
            )
        for s, result in zip(active, results):
            self._after_step(s, result)
        self.faults.check(slots)

    def _generate(self, slots: list[Slot], ready: list[Slot], params) -> tuple[list[Slot], list[str]]:
        """The next reply of every agent in `ready`: one engine call per token limit, with
        `params(call, limit, group)`; each reply becomes a Turn. -> (agents that got one, their texts)."""
        by_limit: dict[int, list[Slot]] = {}
        for s in ready:
            limit = min(self.max_response_length, s.agent.max_tokens)
            s.grammar = self.grammars.of(s, limit)
            if not s.done:  # the env may have failed to list its actions
                by_limit.setdefault(limit, []).append(s)
        self.faults.check(slots)
        active = [s for s in ready if not s.done]
        for call, (limit, group) in enumerate(sorted(by_limit.items())):
            prompts = [self._prompt(s) for s in group]
            constraints = [s.grammar for s in group]
            extra = {"constraints": constraints} if any(c is not None for c in constraints) else {}
            with self.clock.waiting("gen_engine"):
                outputs = self.engine.generate(prompts, params(call, limit, group), **extra)
            for s, out in zip(group, outputs, strict=True):
                s.output = out
        replies = []
        for s in active:
            out = s.output
            ids = list(out.token_ids)
            log_probs = list(out.log_probs) if out.log_probs is not None else None
            grammar = s.grammar
            s.turns.append(
                Turn(
                    prompt_ids=s.pending,
                    response_ids=ids,
                    response_log_probs=log_probs,
                    reward=0.0,
                    finish_reason=out.finish_reason,
                    state_key=s.agent.state_key(),
                    response_allowed=reply_sets(out, grammar),
                    new_context=s.new_context,
                )
            )
            s.ids.extend(ids)
            s.pending, s.new_context = [], False
            replies.append(self.tokenizer.decode(ids, skip_special_tokens=True))
        return active, replies

    def _env_calls(self, calls: list[tuple[Slot, Callable]]) -> list[CallResult]:
        timed = [self.clock.env_call(s.task.name, call) for s, call in calls]
        return run_calls(timed, self.env_workers, self.env_step_timeout)

    def _prompt(self, s: Slot) -> list[int]:
        if len(s.ids) > self.max_prompt_length:
            s.truncated_turns += 1
            if self.truncation == "error":
                raise RolloutError(
                    f"{s.task.name} (seed {s.seed}): prompt of {len(s.ids)} tokens exceeds "
                    f"max_prompt_length {self.max_prompt_length} (rollout.truncation=error)"
                )
        return truncate_prompt(s.ids, self.max_prompt_length, s.keep_prefix, self.truncation)

    def _after_step(self, s: Slot, result: CallResult) -> None:
        turn = s.turns[-1]
        if not result.ok:
            self.faults.fail(s, result.error, result.timed_out, "step")
            return
        step = result.value
        turn.info = dict(step.info)
        self.faults.repaired(s, s.agent.env_repairs)
        env_error = turn.info.get("env_error")
        if env_error:  # the agent caught the env's exception or bad value and ended the episode
            self.faults.fail(
                s,
                turn.info.get("env_traceback") or env_error,
                False,
                "step",
                turn.info.get("env_error_kind") or "exception",
            )
            return
        turn.reward = float(step.reward)
        if step.done or len(s.turns) >= s.agent.max_turns:
            s.done = True
            return
        if s.agent.settings.max_context_window >= 0:
            self._new_context(s, s.agent.context_messages())
            return
        last = turn.response_ids[-1] if turn.response_ids else None
        s.pending = self.chat.turn_delta(s.agent.messages, last)
        s.ids.extend(s.pending)

    def _new_context(self, s: Slot, messages: list[dict]) -> None:
        """The next reply is written to `messages` rendered afresh, not to the episode's ids so far."""
        s.pending = self.chat.first_prompt(messages)
        s.ids = list(s.pending)
        s.keep_prefix = self.chat.system_prefix_length(messages, s.pending)
        s.new_context = True
