"""Agent programs written as a user writes them: plain functions over the `openai` client, named in a task's
`agent_config.program` ("tests.gateway.programs:<function>"). The gateway's tests and the learning test train
on them; `SEEN` keeps what each call's HTTP answer said (the `grl` field) so a test can hold the training
batch against what the program received."""

from __future__ import annotations

import asyncio
import json
import re
import time

FRUITS = ("apple", "pear", "plum", "fig")
SEEN: dict[tuple[str, int, int], list[dict]] = {}  # (task, seed, attempt) -> the `grl` field of each answer

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code; what it prints comes back.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}


def _ask(client, task, messages, **kwargs):
    response = client.chat.completions.create(model=task.model, messages=messages, **kwargs)
    SEEN.setdefault((task.task, task.seed, task.attempt), []).append(response.model_extra["grl"])
    return response.choices[0].message


def _as_dict(message) -> dict:
    return message.model_dump(exclude_none=True)


def fruit_picker(client, task):
    """tests/test_learning.py's fruit game as a program: three rounds, one of four fruits a round
    (`allowed_replies`), the conversation carried on; reward = rounds right, success = all three."""
    wanted = task.config["wanted"]
    messages = [
        {"role": "system", "content": "You pick fruit."},
        {"role": "user", "content": "Pick the right fruit each round. Round 1 of 3. Pick a fruit."},
    ]
    right = 0
    for round_ in range(3):
        reply = _ask(client, task, messages, max_tokens=12, extra_body={"allowed_replies": list(FRUITS)})
        right += re.sub(r"</?answer>", "", reply.content or "").strip() == wanted
        messages += [_as_dict(reply), {"role": "user", "content": f"Round {round_ + 2} of 3. Pick a fruit."}]
    return {"reward": float(right), "success": float(right == 3)}


def gsm8k_with_python(client, task):
    """A GSM8K question; the model first calls the Python tool, choosing one of the computations on the
    question's first two numbers, the program runs it in GRL's sandbox and sends the output back as a
    `tool` message; then the model answers. Reward 1 when the answer's number is the gold one."""
    from grl.envs.gsm8k import extract_answer, load_problems
    from grl.tools import make_tool

    problem = load_problems(task.config["data_path"], "test", None)[task.seed % 20]
    a, b = re.findall(r"\d+", problem.question)[:2]
    candidates = [f'<tool_call>{{"name": "python", "arguments": {{"code": "print({a} {op} {b})"}}}}</tool_call>' for op in "+-*"]
    messages = [
        {"role": "system", "content": "Solve the problem. You may run Python."},
        {"role": "user", "content": problem.question},
    ]
    call = _ask(client, task, messages, tools=[PYTHON_TOOL], max_tokens=48, extra_body={"allowed_replies": candidates})
    messages.append(_as_dict(call))
    python = make_tool("python")
    for tool_call in call.tool_calls or []:
        output = python(json.loads(tool_call.function.arguments)["code"], 200).text
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": output})
    answer = _ask(client, task, messages, tools=[PYTHON_TOOL], max_tokens=8)
    solved = extract_answer(answer.content or "") == problem.gold
    return {"reward": float(solved), "tool_calls": float(len(call.tool_calls or []))}


def rewrites_history(client, task):
    """Asks twice; the second time with its first answer edited: a prefix break."""
    messages = [{"role": "user", "content": "Say something."}]
    first = _ask(client, task, messages, max_tokens=4)
    _ask(
        client,
        task,
        [*messages, {"role": "assistant", "content": (first.content or "") + " (edited)"}, {"role": "user", "content": "Again."}],
        max_tokens=4,
    )
    return 0.5


def one_call(client, task):
    _ask(client, task, [{"role": "user", "content": "Hello."}], max_tokens=2)
    return 1.0


def raises(client, task):
    _ask(client, task, [{"role": "user", "content": "Hello."}], max_tokens=2)
    raise RuntimeError("the program's own bug")


def hangs(client, task):
    _ask(client, task, [{"role": "user", "content": "Hello."}], max_tokens=2)
    time.sleep(3600)


def returns_text(client, task):
    _ask(client, task, [{"role": "user", "content": "Hello."}], max_tokens=2)
    return "great"


def returns_nan(client, task):
    return float("nan")


def returns_a_function_of_the_messages(client, task):
    _ask(client, task, [{"role": "user", "content": "Hello."}], max_tokens=2)
    return lambda messages: {"reward": float(len(messages)), "turns": 1.0}


def floods(client, task):
    """1000 calls of one episode at once; what the gateway refuses comes back as errors."""
    import openai

    async def all_at_once():
        async with openai.AsyncOpenAI(base_url=str(client.base_url), api_key="grl", max_retries=0) as flood:
            calls = [
                flood.chat.completions.create(model=task.model, messages=[{"role": "user", "content": str(i)}], max_tokens=1)
                for i in range(1000)
            ]
            return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(all_at_once())
    return {"reward": 1.0, "answered": float(sum(not isinstance(r, Exception) for r in results))}
