"""Agent programs written as a user writes them: plain functions over the `openai` client, named in a task's
`agent_config.program` ("tests.gateway.programs:<function>"). The gateway's tests and the learning test train
on them; `SEEN` keeps what each call's HTTP answer said (the `grl` field) so a test can hold the training
batch against what the program received. Programs run in worker processes (grl/gateway/program_pool.py),
so `SEEN` keeps it in files, in a folder the workers learn from the test's environment."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

FRUITS = ("apple", "pear", "plum", "fig")


class SeenAnswers:
    """(task, seed, attempt) -> the `grl` field of each answer that episode's program received."""

    def __init__(self):
        self.folder = Path(
            os.environ.setdefault("GRL_TEST_SEEN_ANSWERS", tempfile.mkdtemp(prefix="grl-seen-"))
        )

    def add(self, key: tuple[str, int, int], grl: dict) -> None:
        with open(self._file(key), "a") as f:
            f.write(json.dumps(grl) + "\n")

    def __getitem__(self, key: tuple[str, int, int]) -> list[dict]:
        if not self._file(key).exists():
            raise KeyError(key)
        return [json.loads(line) for line in self._file(key).read_text().splitlines()]

    def clear(self) -> None:
        for file in self.folder.glob("*.jsonl"):
            file.unlink()

    def _file(self, key: tuple[str, int, int]) -> Path:
        return self.folder / "{}-{}-{}.jsonl".format(*key)


SEEN = SeenAnswers()

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
    SEEN.add((task.task, task.seed, task.attempt), response.model_extra["grl"])
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
    candidates = [
        f'<tool_call>{{"name": "python", "arguments": {{"code": "print({a} {op} {b})"}}}}</tool_call>'
        for op in "+-*"
    ]
    messages = [
        {"role": "system", "content": "Solve the problem. You may run Python."},
        {"role": "user", "content": problem.question},
    ]
    call = _ask(
        client, task, messages, tools=[PYTHON_TOOL], max_tokens=48, extra_body={"allowed_replies": candidates}
    )
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
        [
            *messages,
            {"role": "assistant", "content": (first.content or "") + " (edited)"},
            {"role": "user", "content": "Again."},
        ],
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
                flood.chat.completions.create(
                    model=task.model, messages=[{"role": "user", "content": str(i)}], max_tokens=1
                )
                for i in range(1000)
            ]
            return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(all_at_once())
    return {"reward": 1.0, "answered": float(sum(not isinstance(r, Exception) for r in results))}


async def one_call_async(client, task):
    """`one_call` as an `async def`: given an `openai.AsyncOpenAI`."""
    messages = [{"role": "user", "content": "Hello."}]
    response = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=2)
    return {
        "reward": 1.0,
        "answered_tokens": float(len(response.model_extra["grl"]["completion_token_ids"][0])),
    }


# Faults only a process can have: each must end its own episode and worker, never the trainer. Each writes
# the pid of its process to `task.config["pid_folder"]`, for the test to check that none is left.


def _note_pid(task, pid: int) -> None:
    (Path(task.config["pid_folder"]) / f"{task.task}-{pid}").touch()


def exits(client, task):
    one_call(client, task)
    _note_pid(task, os.getpid())
    os._exit(3)


def segfaults(client, task):
    one_call(client, task)
    _note_pid(task, os.getpid())
    ctypes.string_at(0)


def grows(client, task):
    """Holds far more memory than its task's `program_max_rss_mb`, then waits to be stopped."""
    one_call(client, task)
    _note_pid(task, os.getpid())
    held = b"x" * (int(task.config["megabytes"]) << 20)
    time.sleep(3600)
    return float(len(held))


def hangs_noted(client, task):
    _note_pid(task, os.getpid())
    hangs(client, task)


def leaves_a_process(client, task):
    """Starts a process in a session of its own (out of its worker's process group) and returns without
    ending it."""
    one_call(client, task)
    _note_pid(task, os.getpid())
    child = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    _note_pid(task, child.pid)
    return 1.0


IMPORTED_BY = os.getpid()  # the process that imported this module: a pool's template, not each worker


def tells_who_imported_it(client, task):
    """Returns the pid of its process and of the one that imported its module (exits with 3 when told to)."""
    if task.config.get("exit"):
        os._exit(3)
    return {"reward": 1.0, "pid": float(os.getpid()), "imported_by": float(IMPORTED_BY)}
