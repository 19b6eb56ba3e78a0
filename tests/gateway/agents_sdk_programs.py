"""An agent written with the OpenAI Agents SDK (`openai-agents` on PyPI) as its users write one: an `Agent`
with
instructions, a Responses-API model over the client the gateway hands in, `Runner.run` once a round with the
conversation so far. Nothing of GRL is imported; the SDK is unmodified. tests/test_learning.py trains it."""

from __future__ import annotations

import re

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

FRUITS = ("apple", "pear", "plum", "fig")

# The SDK exports traces to OpenAI's servers by default; a training run reaches nothing outside this machine.
set_tracing_disabled(True)


async def fruit_picker(client, task):
    """tests/gateway/programs.py's `fruit_picker` as an Agents SDK agent: three rounds, one of four fruits a
    round (`allowed_replies`, through the SDK's `extra_body`), the run's items carried into the next round;
    reward = rounds right, success = all three."""
    wanted = task.config["wanted"]
    picker = Agent(
        name="fruit picker",
        instructions="You pick fruit.",
        model=OpenAIResponsesModel(model=task.model, openai_client=client),
        model_settings=ModelSettings(max_tokens=12, extra_body={"allowed_replies": list(FRUITS)}),
    )
    conversation = [
        {"role": "user", "content": "Pick the right fruit each round. Round 1 of 3. Pick a fruit."}
    ]
    right = 0
    for round_ in range(3):
        result = await Runner.run(picker, conversation)
        right += re.sub(r"</?answer>", "", result.final_output or "").strip() == wanted
        conversation = [
            *result.to_input_list(),
            {"role": "user", "content": f"Round {round_ + 2} of 3. Pick a fruit."},
        ]
    return {"reward": float(right), "success": float(right == 3)}
