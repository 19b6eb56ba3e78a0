"""Do two cores of this machine work as two machines? What a rollout beside the update can gain here.

    .venv/bin/python bench/bench_cores.py [--seconds 8]

Two kinds of work, each first in one process pinned to core 0 with one thread, then in two such
processes at once, pinned to cores 0 and 1: a bf16 matmul (compute-bound, as a large batch's forward)
and a copy of 256 MiB (bound by memory traffic, as decoding a small batch, which reads every weight for
each token). Printed: each one's throughput alone, each process's beside its twin, and the ratio of the
two. A ratio near 1 means a core's work does not slow the other's; near 0.5 means the two share one
resource, and a rollout on one core beside the update on the other can gain little over running them
one after the other on both.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import torch

COPY_BYTES = 256 * 2**20
MATMUL_SIDE = 1024


def throughput(kind: str, core: int, seconds: float, start: mp.Event, out: mp.Queue) -> None:
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    if kind == "matmul":
        a = torch.randn(MATMUL_SIDE, MATMUL_SIDE, dtype=torch.bfloat16)
        b = torch.randn_like(a)
        work, units = (lambda: a @ b), 2 * MATMUL_SIDE**3 / 1e9  # GFLOP
    else:
        src = torch.empty(COPY_BYTES // 4)
        dst = torch.empty_like(src)
        work, units = (lambda: dst.copy_(src)), 2 * COPY_BYTES / 1e9  # GB read and written
    for _ in range(3):
        work()
    start.wait()
    begin, done = time.perf_counter(), 0
    while time.perf_counter() - begin < seconds:
        work()
        done += 1
    out.put(done * units / (time.perf_counter() - begin))


def measure(kind: str, cores: list[int], seconds: float) -> list[float]:
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=throughput, args=(kind, core, seconds, start, out)) for core in cores]
    for proc in procs:
        proc.start()
    time.sleep(2.0)  # both warmed up before either times
    start.set()
    rates = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("bench_cores: needs two cores")
    for kind, unit in (("matmul", "GFLOP/s"), ("copy", "GB/s")):
        (alone,) = measure(kind, cores[:1], args.seconds)
        together = measure(kind, cores[:2], args.seconds)
        print(
            f"{kind:6} alone {alone:7.1f} {unit}; two at once {' + '.join(f'{r:.1f}' for r in together)}; "
            f"each beside its twin {min(together) / alone:.2f}-{max(together) / alone:.2f}x of alone, "
            f"both together {sum(together) / alone:.2f}x"
        )


if __name__ == "__main__":
    main()
