"""Continuous batching of the gateway's calls against the fixed 10 ms waves it had before
(grl/gateway/batching.py).

    .venv/bin/python bench/bench_gateway_batching.py [--programs 1 8 32] [--turns 2] [--kinds 2] [--repeats 3]

N programs in flight, each in a worker process of a `ProgramPool` with a real `openai` client, play a chat of
`--turns` calls against the tiny model through the gateway's HTTP server, while this thread serves the engine
as the trainer's rollout does. `--kinds` sets how many reply limits (`max_tokens`) the programs ask for,
spread
over them: calls of different limits cannot share an engine call (two tasks with their own `max_tokens`).
Each call carries a seed, so both policies are asked the same work. Printed per N, medians of `--repeats`
runs with the policies alternating: calls/s and completion tokens/s of each policy, its mean engine batch,
how long the engine sat idle per engine call (the wall time not spent in `generate`: the gather window, HTTP,
the programs), and the ratio of the paired runs.
The waves are `BatchingEngine(gather_s=0.01)`: an engine call serves one kind, and a kind left waiting goes
next with its calls that arrived meanwhile; before, a wave's kinds were served one after another and a call
arriving meanwhile waited for the next wave, so the baseline is, if anything, faster than the old code.

Then `grl serve`'s engine: N threads each make `--turns` calls straight to a `SerialEngine` (the calls that
wait during a generate share the next) and, as the baseline, to a lock around `generate` (what `grl serve`
had: one generate a call). Printed: calls/s, tokens/s, engine calls and the ratio (best of `--repeats`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grl.engines import SamplingParams, make_engine  # noqa: E402
from grl.gateway import Gateway, build_app  # noqa: E402
from grl.gateway.batching import BatchingEngine, SerialEngine  # noqa: E402
from grl.gateway.contract import ProgramTask  # noqa: E402
from grl.gateway.program_pool import ProgramPool  # noqa: E402
from grl.gateway.program_worker import ProgramCall  # noqa: E402
from grl.gateway.serving import LocalServer  # noqa: E402
from grl.models import load_tokenizer  # noqa: E402

PROGRAM = "bench_gateway_batching:chat"  # this file, importable in a worker: its folder is on sys.path
WAVE_S = 0.01  # the gateway's gather window before continuous batching
MAX_TOKENS = 16


def chat(client, task):
    """A program: a chat of `turns` calls, each answering the conversation so far."""
    messages = [{"role": "user", "content": f"Count on from {task.seed}."}]
    for turn in range(task.config["turns"]):
        reply = client.chat.completions.create(
            model=task.model,
            messages=messages,
            max_tokens=task.config["max_tokens"],
            seed=task.seed * 100 + turn,
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        messages.append({"role": "user", "content": "Go on."})
    return 1.0


class CountingEngine:
    """The engine, counting its calls, the tokens they sampled and the seconds it was busy."""

    def __init__(self, engine):
        self.engine, self.calls, self.tokens, self.busy = engine, 0, 0, 0.0

    def generate(self, prompts, sampling, constraints=None):
        start = time.perf_counter()
        outputs = self.engine.generate(prompts, sampling, constraints)
        self.busy += time.perf_counter() - start
        self.calls += 1
        self.tokens += sum(len(out.token_ids) for out in outputs)
        return outputs


class OneGenerateACall:
    """`grl serve`'s engine before continuous batching: a lock around `generate`."""

    def __init__(self, engine):
        self.engine, self._lock = engine, threading.Lock()

    def generate(self, prompts, sampling, constraints=None):
        with self._lock:
            return self.engine.generate(prompts, sampling, constraints)


def call_straight(
    shared, engine: CountingEngine, prompts: list[list[int]], turns: int
) -> tuple[float, int, int, float]:
    """(seconds, engine calls, tokens, seconds in the engine) of one thread per prompt calling
    `shared.generate`
    `turns` times."""

    def caller(i: int) -> None:
        for turn in range(turns):
            shared.generate([prompts[i]], SamplingParams(max_new_tokens=MAX_TOKENS, seed=i * 100 + turn))

    calls, tokens, busy, start = engine.calls, engine.tokens, engine.busy, time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as threads:
        list(threads.map(caller, range(len(prompts))))
    return time.perf_counter() - start, engine.calls - calls, engine.tokens - tokens, engine.busy - busy


def serve_bench(engine: CountingEngine, tokenizer, args) -> None:
    engines = {"one generate a call": OneGenerateACall(engine), "SerialEngine": SerialEngine(engine)}
    for callers in args.programs:
        prompts = [tokenizer.encode(f"Count on from {i}.") for i in range(callers)]
        runs = {name: [] for name in engines}
        for _ in range(args.repeats):  # alternating, so that both see the machine's load alike
            for name, shared in engines.items():
                runs[name].append(call_straight(shared, engine, prompts, args.turns))
        best = {name: min(measured) for name, measured in runs.items()}
        for name, (seconds, engine_calls, tokens, busy) in best.items():
            print(
                f"grl serve, {callers:3d} callers, {name:>19}: {callers * args.turns / seconds:6.2f} calls/s "
                f"{tokens / seconds:7.1f} tokens/s, {engine_calls} engine calls taking {busy:.2f} s of "
                f"{seconds:.2f} s"
            )
        before, after = best["one generate a call"], best["SerialEngine"]
        print(
            f"grl serve, {callers:3d} callers, SerialEngine / one generate a call: "
            f"{before[0] / after[0]:.2f}x calls/s"
        )


def play(
    batching: BatchingEngine, pool: ProgramPool, url: str, programs: int, turns: int, kinds: int, tag: str
) -> float:
    """Seconds `programs` chats take through `batching`; every program must return its reward."""
    start = time.perf_counter()
    for i in range(programs):
        limit = MAX_TOKENS - 4 * (i % kinds)
        task = ProgramTask("bench", i, i, 0, {"turns": turns, "max_tokens": limit})
        pool.submit(i, ProgramCall(PROGRAM, f"{url}/episodes/{tag}-{i}/v1", task, 600.0), list)
    results = []
    batching.serving(True)
    try:
        while pool.pending:
            batching.serve(wait=0.05)
            results += pool.collect()
    finally:
        batching.serving(False)
    seconds = time.perf_counter() - start
    bad = [outcome for _, outcome in results if not outcome.ok or outcome.value != (1.0, {})]
    if len(results) != programs or bad:
        sys.exit(
            f"bench_gateway_batching: {len(results)} of {programs} programs came back; first bad: {bad[:1]}"
        )
    return seconds


def gateway_bench(engine: CountingEngine, tokenizer, args) -> None:
    policies = {"waves": BatchingEngine(engine, gather_s=WAVE_S), "continuous": BatchingEngine(engine)}
    servers = {
        name: LocalServer(
            build_app(Gateway(batching, tokenizer, "tiny", max_tokens=MAX_TOKENS, context=2048))
        )
        for name, batching in policies.items()
    }
    pool = ProgramPool(max(args.programs), 600.0)
    try:
        for name, batching in policies.items():  # starts the workers, warms the engine and both servers
            play(batching, pool, servers[name].url, max(args.programs), 1, 1, f"warm-up-{name}")
        for programs in args.programs:
            runs = {
                name: [] for name in policies
            }  # per repeat: (calls/s, tokens/s, mean batch, idle ms per engine call)
            for repeat in range(args.repeats):
                for name, batching in policies.items():
                    before = (engine.calls, engine.tokens, engine.busy)
                    tag = f"{name}-{programs}-{repeat}"
                    seconds = play(batching, pool, servers[name].url, programs, args.turns, args.kinds, tag)
                    engine_calls, tokens, busy = (
                        now - then for now, then in zip((engine.calls, engine.tokens, engine.busy), before)
                    )
                    calls = programs * args.turns
                    runs[name].append(
                        (
                            calls / seconds,
                            tokens / seconds,
                            calls / engine_calls,
                            (seconds - busy) / engine_calls * 1e3,
                        )
                    )
            for name, measured in runs.items():
                rate, token_rate, batch, idle = (statistics.median(column) for column in zip(*measured))
                print(
                    f"{programs:3d} programs, {name:>10}: {rate:6.2f} calls/s {token_rate:7.1f} tokens/s, "
                    "mean engine batch "
                    f"{batch:5.2f} calls, engine idle {idle:5.1f} ms per engine call (medians of "
                    f"{args.repeats})"
                )
            ratios = [(c[0] / w[0], c[1] / w[1]) for c, w in zip(runs["continuous"], runs["waves"])]
            calls_ratio, tokens_ratio = (statistics.median(column) for column in zip(*ratios))
            paired = f"{calls_ratio:.2f}x calls/s, {tokens_ratio:.2f}x tokens/s"
            print(f"{programs:3d} programs, continuous / waves (median of paired runs): {paired}")
    finally:
        pool.close()
        for server in servers.values():
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--kinds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--only-serve", action="store_true", help="only the grl serve part")
    args = parser.parse_args()
    if not 1 <= args.kinds <= 3:
        sys.exit(f"--kinds: {args.kinds} is not 1, 2 or 3 (the limits are 16, 12 and 8 tokens)")

    engine = CountingEngine(make_engine("hf", "tiny", dtype=args.dtype, device="cpu"))
    tokenizer = load_tokenizer("tiny")
    if not args.only_serve:
        gateway_bench(engine, tokenizer, args)
    serve_bench(engine, tokenizer, args)


if __name__ == "__main__":
    main()
