"""The generic Agent: an env seen through a chat.

One Agent owns one env. `reset(seed)` gives the first messages; each
`step(reply)` parses the model's reply (grl/agents/parse.py), runs its
actions in the env within the budgets, and appends the reply and the next
user message. The rollout layer renders `messages` with the tokenizer's chat
template; the agent never sees a token.

With `action_decoding: constrained` the engine may only write one of the
env's `valid_actions()` per reply (grl/engines/constraint.py; free decoding
where the env has none), so every answer parses and every action is valid;
`answer_choices()` gives the rollout those actions.

With `tools` (e.g. `[python]`), a reply holding a tool call is a tool turn (grl/agents/tool_use.py):
the tool runs, its output is the next message, the env is not stepped.

An episode ends when the env is done, after `max_turns` replies, when
`max_actions_all_turns` actions are spent, or when the env raises (reported
in `info["env_error"]`, never raised) or returns a value that breaks the contract (checked by
grl/envs/checks.py, its kind in `info["env_error_kind"]`: `policy` for a PolicyFault). Actions beyond
`max_actions_per_turn`
in one reply are dropped. A turn's reward is the sum of its actions' env
rewards plus `format_penalty` when the reply has no usable answer or holds an
action the env calls invalid. Every action the env is given counts against
the budget, valid or not.
"""

from __future__ import annotations

import hashlib
import traceback
from typing import Any, Mapping

from omegaconf import OmegaConf

from grl.agents.parse import ToolCall, parse_reply, parse_tool_calls
from grl.agents.tasks import TaskHooks
from grl.agents.tool_use import ToolUse
from grl.agents.turns import AgentStep, TurnInfo, context_window
from grl.envs.base import Env, fault_kind
from grl.envs.checks import EnvValueError, Repair, check_observation, check_step, check_valid_actions
from grl.schema import AgentConfig, checked


AgentSettings = AgentConfig  # `agent_config` of a task instance, as the schema declares it


def settings_from_mapping(cfg: Mapping[str, Any], where: str) -> AgentSettings:
    """Settings merged into the schema and checked there; a bad key raises ConfigError (a
    ValueError) naming `where.key`."""
    return OmegaConf.to_object(checked(AgentConfig, dict(cfg), f"{where}."))


class Agent:
    def __init__(
        self,
        task_name: str,
        settings: AgentSettings,
        env: Env,
        hooks: TaskHooks,
        tools: Mapping[str, Any] | None = None,
    ):
        self.task_name = task_name
        self.settings = settings
        self.env = env
        self.hooks = hooks
        self.tool_use = (
            ToolUse(
                tools,
                settings.max_tool_calls_per_turn,
                settings.max_tool_calls,
                settings.max_tool_output_chars,
            )
            if tools
            else None
        )
        self.messages: list[dict[str, str]] = []
        self.env_repairs: list[Repair] = []  # what was repaired in the env's values by the latest reset/step
        self._start_episode("")
        self._done = True

    # The rollout layer reads these three.
    @property
    def max_turns(self) -> int:
        return self.settings.max_turns

    @property
    def max_tokens(self) -> int:
        return self.settings.max_tokens

    @property
    def format_penalty(self) -> float:
        return self.settings.format_penalty

    @property
    def observation(self) -> str | None:
        """The env's latest state (what the next user message would show)."""
        return self._observation

    # ------------------------------------------------------------ prompts

    @property
    def constrained(self) -> bool:
        return self.settings.action_decoding == "constrained"

    def answer_choices(self) -> list[str] | None:
        """The answers a constrained reply may hold now (the env's valid actions), or None for
        free decoding. Choices that are tool calls are offered only while the tool budget lasts."""
        if not self.constrained:
            return None
        choices = check_valid_actions(self.env.valid_actions())
        if self.tool_use and self.tool_use.spent():
            choices = [c for c in choices if not parse_tool_calls(c)] or choices
        return choices

    def format_text(self) -> str:
        """The reply format, stated from the settings so that it always matches the parser."""
        s = self.settings
        if self.constrained:
            think = "<think>your reasoning</think>" if s.enable_think else ""
            return f"Reply in the form {think}<answer>one action</answer>."
        if s.enable_think:
            text = "Reply in the form <think>your reasoning</think><answer>your answer</answer>."
        else:
            text = "End your reply with <answer>your answer</answer>."
        if s.action_separator and s.max_actions_per_turn > 1:
            text += (
                f" Separate actions with {s.action_separator.strip() or s.action_separator!r}"
                f" and give at most {s.max_actions_per_turn} per answer."
            )
        return text

    def _state_text(self, observation: str) -> str:
        actions_left = self.settings.max_actions_all_turns - self._actions_used
        per_turn = 1 if self.constrained else self.settings.max_actions_per_turn
        return (
            f"Turn {self._turn + 1}. State:\n{observation}\n"
            f"{self.hooks.budget_text(actions_left, per_turn, self.settings.brief_turns)}"
        )

    def instructions(self) -> str:
        """The task, the legend, the actions and the reply format: the first message before its state."""
        tool_text = self.tool_use.prompt_text() if self.tool_use else ""
        parts = [
            self.settings.prompt.strip(),
            self.env.legend().strip(),
            self.env.action_help().strip(),
            self.format_text(),
            tool_text,
        ]
        return "\n\n".join(p for p in parts if p)

    def _first_user_message(self, observation: str) -> str:
        return "\n\n".join(p for p in (self.instructions(), self._state_text(observation)) if p)

    def context_messages(self) -> list[dict[str, str]]:
        """The chat the next reply is written to: `messages`, cut to `max_context_window` turns."""
        return context_window(self.messages, self.instructions(), self.settings.max_context_window)

    def next_user_message(self, reward: float, feedback: str, observation: str) -> str:
        # brief_turns: a zero reward is said by its absence (a game that pays only at its end would
        # otherwise repeat "Reward: 0" every turn, tokens the model reads and the update computes on).
        shown = reward or not self.settings.brief_turns
        parts = [f"Reward: {reward:g}" if shown else "", feedback, self._state_text(observation)]
        return "\n".join(p for p in parts if p)

    # ------------------------------------------------------------ episode

    def reset(self, seed: int) -> list[dict[str, str]]:
        observation, self.env_repairs = check_observation(self.env.reset(seed), "reset")
        self._start_episode(observation)
        self.messages = [
            {"role": "system", "content": self.settings.system_prompt},
            {"role": "user", "content": self._first_user_message(observation)},
        ]
        return list(self.messages)

    def state_key(self) -> str:
        """A key of the env state the next reply acts on: the rendered observation's hash, so
        that agents of a group that reach the same state share it (GiGPO's anchor states)."""
        return hashlib.sha1(self._observation.encode()).hexdigest()

    def _start_episode(self, observation: str) -> None:
        self._observation = observation
        self._turn = 0
        self._actions_used = 0
        self._done = False
        self._success = False
        self._valid: list[bool] = []
        self._effective: list[bool] = []
        self._format_ok: list[bool] = []
        self._env_infos: list[dict[str, Any]] = []
        if self.tool_use:
            self.tool_use.reset()

    def step(self, reply_text: str) -> AgentStep:
        if self._done:
            return AgentStep(
                0.0, True, self._info(format_error="the episode is over; call reset()", env_done=True)
            )
        reply = reply_text if isinstance(reply_text, str) else ""
        s = self.settings
        tool_calls = parse_tool_calls(reply) if self.tool_use else []
        if tool_calls:
            return self._tool_turn(reply, tool_calls)
        parsed = parse_reply(reply, s.enable_think)
        answer = parsed.answer if parsed.format_ok else self.hooks.fallback_answer(reply)
        proposed = self.hooks.actions(answer, s.action_separator)
        room = min(s.max_actions_per_turn, s.max_actions_all_turns - self._actions_used)

        reward, env_done, observation = 0.0, False, None
        fault: dict[str, str] = {}  # the env broke the episode: env_error, env_error_kind (, env_traceback)
        executed, invalid = [], []
        self.env_repairs = []
        for action in proposed[:room]:
            try:
                result = self.env.step(action)
            except Exception as err:  # a broken env ends this episode, never the rollout
                fault = {
                    "env_error": f"{type(err).__name__}: {err}",
                    "env_error_kind": fault_kind(err),
                    "env_traceback": traceback.format_exc(),
                }
                break
            try:
                observation, action_reward, env_done, env_info, repairs = check_step(result)
            except EnvValueError as err:  # so does a malformed result
                fault = {"env_error": str(err), "env_error_kind": err.kind}
                break
            self.env_repairs += repairs
            executed.append(action)
            reward += action_reward
            self._env_infos.append(env_info)
            self._valid.append(bool(env_info.get("action_is_valid", False)))
            self._effective.append(bool(env_info.get("action_is_effective", False)))
            self._success = bool(env_info.get("success", False))
            if not self._valid[-1]:
                invalid.append(action)
            if env_done:
                break
        self._actions_used += len(executed)
        self._format_ok.append(parsed.format_ok)
        self._turn += 1

        penalised = not parsed.format_ok or bool(invalid)
        if penalised:
            reward += s.format_penalty
        done = (
            env_done
            or bool(fault)
            or self._turn >= s.max_turns
            or self._actions_used >= s.max_actions_all_turns
        )
        self._done = done
        if observation is not None:
            self._observation = observation
        over_budget = max(0, len(proposed) - room)
        info = self._info(
            actions=executed,
            actions_dropped=over_budget,
            invalid_actions=invalid,
            format_ok=parsed.format_ok,
            format_error=parsed.error,
            penalised=penalised,
            env_done=env_done,
            think=parsed.think,
            answer=answer,
            **fault,
        )
        self.messages.append({"role": "assistant", "content": reply})
        if not done:
            feedback = self._feedback(parsed.error, invalid, over_budget)
            self.messages.append(
                {"role": "user", "content": self.next_user_message(reward, feedback, self._observation)}
            )
        return AgentStep(reward, done, info)

    def _tool_turn(self, reply: str, calls: list[ToolCall]) -> AgentStep:
        """Run the reply's tool calls; their output is the next message. The env is not stepped and
        the turn earns nothing; it counts against `max_turns`."""
        output = self.tool_use.run(calls)
        self._turn += 1
        self._done = self._turn >= self.settings.max_turns
        self.messages.append({"role": "assistant", "content": reply})
        if not self._done:
            self.messages.append({"role": "tool", "content": output})
        return AgentStep(0.0, self._done, self._info(format_ok=True, tool_output=output))

    def _info(self, **changes: Any) -> TurnInfo:
        """This turn's info: a turn that ran no action, with `changes` applied."""
        info = TurnInfo(
            turn=self._turn,
            actions=[],
            actions_dropped=0,
            invalid_actions=[],
            format_ok=False,
            format_error="",
            penalised=False,
            success=self._success,
            env_done=False,
            env_error=None,
            env_error_kind=None,
            env_traceback=None,
            think=None,
            answer=None,
        )
        info.update(changes)  # type: ignore[typeddict-item]
        return info

    def _feedback(self, format_error: str, invalid: list[str], over_budget: int) -> str:
        notes = []
        if format_error:
            notes.append(f"Format error: {format_error}.")
        if invalid:
            notes.append(f"Invalid action{'s' if len(invalid) > 1 else ''}: {', '.join(map(repr, invalid))}.")
        if over_budget > 0:
            notes.append(f"{over_budget} action{'s' if over_budget > 1 else ''} over the limit ignored.")
        return " ".join(notes)

    def episode_metrics(self) -> dict[str, float]:
        def share(flags: list[bool]) -> float:
            return sum(flags) / len(flags) if flags else 0.0

        return {
            "success": float(self._success),
            "num_actions": float(len(self._valid)),
            "action_is_valid": share(self._valid),
            "action_is_effective": share(self._effective),
            "format_ok": share(self._format_ok),
            "num_turns": float(self._turn),
            **self.hooks.episode_extras(self._env_infos),
            **(self.tool_use.metrics() if self.tool_use else {}),
        }

    def close(self) -> None:
        self.env.close()
