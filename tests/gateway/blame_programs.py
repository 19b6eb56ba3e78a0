"""Agent programs that say whose doing their episode's end is (grl/envs/base.py PolicyFault, InfraFault), or
whose clock runs out waiting for the model or in their own code: tests/gateway/test_program_blame.py."""

from __future__ import annotations

import time

from grl.envs import InfraFault, PolicyFault


def _ask(client, task, text: str = "Hello.") -> str:
    reply = client.chat.completions.create(
        model=task.model, messages=[{"role": "user", "content": text}], max_tokens=2
    )
    return reply.choices[0].message.content or ""


def blames_the_policy(client, task):
    _ask(client, task)
    raise PolicyFault("the reply names no move")


def blames_the_sandbox(client, task):
    _ask(client, task)
    raise InfraFault("the sandbox would not start", kind="sandbox")


def keeps_asking(client, task):
    """Asks the model one new question after another: its clock runs out waiting for the replies."""
    asked = 0
    while True:
        asked += 1
        _ask(
            client, task, f"Question {asked}: hello?"
        )  # a repeated request would be answered from the record


def hangs_after_a_call(client, task):
    _ask(client, task)
    time.sleep(3600)
