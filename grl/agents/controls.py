"""The observation-swap control: does the policy act on what it sees?

A `SwappedAgent` plays the real game (its rewards, its end, its success) but
shows the model the chat of a decoy game: the same task at another seed,
driven by the same replies. A policy that reads the board does worse when it
is shown the wrong one; a policy that plays a fixed sequence ("always Down")
scores the same in both arms. Validation runs it beside the true pass when
`trainer.validation_controls` names `swap` (`val-env/<task>/success_swapped`).

The decoy is only a picture: when its game ends before the real one, the model
keeps seeing the decoy's last state. The valid actions (constrained decoding)
come from the real game, since the replies act there; the tasks this control
is meant for have the same actions in every state.
"""

from __future__ import annotations

from typing import Any, Mapping

from grl.agents.base import Agent
from grl.agents.turns import AgentStep, context_window
from grl.agents.tasks import Task

DECOY_SEED_OFFSET = (
    7_777_777  # far from training (seed + step * 100003) and validation (validation_seed + i) seeds
)


def decoy_seed(seed: int) -> int:
    return seed + DECOY_SEED_OFFSET


class SwappedAgent:
    """The rollout's agent interface over a real agent and a decoy agent of the same task."""

    def __init__(self, real: Agent, decoy: Agent):
        self.real, self.decoy = real, decoy
        self.messages: list[dict[str, str]] = []

    @property
    def settings(self):
        return self.real.settings

    @property
    def max_turns(self) -> int:
        return self.real.max_turns

    @property
    def max_tokens(self) -> int:
        return self.real.max_tokens

    @property
    def format_penalty(self) -> float:
        return self.real.format_penalty

    @property
    def observation(self) -> str | None:
        return self.decoy.observation

    @property
    def env_repairs(self) -> list:
        """What the env checks repaired in the latest reset or step, in either game."""
        return self.real.env_repairs + self.decoy.env_repairs

    def answer_choices(self) -> list[str] | None:
        return self.real.answer_choices()

    def context_messages(self) -> list[dict[str, str]]:
        return context_window(self.messages, self.decoy.instructions(), self.settings.max_context_window)

    def reset(self, seed: int) -> list[dict[str, str]]:
        self.real.reset(seed)
        self.messages = [dict(m) for m in self.decoy.reset(decoy_seed(seed))]
        return list(self.messages)

    def step(self, reply_text: str) -> AgentStep:
        result = self.real.step(reply_text)
        shown = len(self.decoy.messages)
        self.decoy.step(reply_text)  # a finished decoy changes nothing and says so in its info
        self.messages.append(
            {"role": "assistant", "content": reply_text if isinstance(reply_text, str) else ""}
        )
        if not result.done:
            fresh = [m for m in self.decoy.messages[shown:] if m["role"] != "assistant"]
            if fresh:
                self.messages.append(dict(fresh[-1]))
            # a finished decoy writes no message: its final board is shown at the real game's turn and budget
            else:
                self.messages.append(
                    {"role": "user", "content": self.real.next_user_message(0.0, "", self.decoy.observation)}
                )
        return result

    def state_key(self) -> str:
        return self.decoy.state_key()

    def episode_metrics(self) -> dict[str, float]:
        return self.real.episode_metrics()

    def close(self) -> None:
        try:
            self.real.close()
        finally:
            self.decoy.close()


def make_swapped_agent(task_name: str, task: Task | Mapping[str, Any], sandbox=None) -> SwappedAgent:
    """`make_agent`'s signature, for `MultiTurnRollout(agent_factory=...)`."""
    from grl.agents import make_agent

    return SwappedAgent(make_agent(task_name, task, sandbox), make_agent(task_name, task, sandbox))


# A control's agent factory, and the name its success is reported under (`val-env/<task>/<name>`).
VALIDATION_CONTROLS = {"swap": make_swapped_agent}
CONTROL_METRIC = {"swap": "success_swapped"}
