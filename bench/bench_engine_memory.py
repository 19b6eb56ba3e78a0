"""The hf engine's rank: its peak resident memory and the run's wall time on the held-out Sokoban validation
of docs/RESULTS.md (128 puzzles, each played again shown a decoy board: 256 rows of up to ten turns), once
per KV budget asked, the first the baseline the others' ratios are against.

    .venv/bin/python bench/bench_engine_memory.py [--budgets default 3] [--puzzles 128] [override ...]

`default` leaves `actor_rollout_ref.rollout.kv_cache_gb` to the plan (half the free host memory); a number
sets it. Each run is `grl-train preset=sokoban_cpu trainer.val_only=true` with the base model, command to
exit; every process of its tree is read for its peak (Linux VmHWM) twice a second, so a short peak is seen
too. The rank with the highest peak is the one holding the engine (the others hold no KV cache). The greedy
validation's figures are printed beside, so that equal play can be seen.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from grl.tracking import METRICS_FILE
from grl.trainer.report import VAL_ONLY_FOLDER

GRL_TRAIN = Path(sys.executable).with_name("grl-train")


def peak_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def run(budget: str, puzzles: int, extra: list[str]) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="grl-engine-memory-"))
    command = [
        str(GRL_TRAIN),
        "preset=sokoban_cpu",
        "trainer.val_only=true",
        "rollout.validation_seed=999",
        f"rollout.validation_agent_group_num=[{puzzles}]",
        f"trainer.run_dir={run_dir}",
        *([] if budget == "default" else [f"actor_rollout_ref.rollout.kv_cache_gb={budget}"]),
        *extra,
    ]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, tuple[int, str]] = {}
    while child.poll() is None:
        try:
            tree = [psutil.Process(child.pid), *psutil.Process(child.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for process in tree:
            kib = peak_kib(process.pid)
            if kib > peaks.get(process.pid, (0, ""))[0]:
                try:
                    name = " ".join(process.cmdline())[:60]
                except psutil.Error:
                    name = "?"
                peaks[process.pid] = (kib, name)
        time.sleep(0.5)
    wall = time.perf_counter() - start
    if child.wait() != 0:
        raise SystemExit(
            f"budget {budget}: grl-train exited {child.returncode}: {child.stderr.read()[-2000:]}"
        )
    records = run_dir / VAL_ONLY_FOLDER / METRICS_FILE
    metrics = [json.loads(line) for line in records.read_text().splitlines()]
    validation = {k: v for row in metrics for k, v in row.items() if k.startswith("val") and "success" in k}
    top = sorted(peaks.values(), reverse=True)
    return {
        "budget": budget,
        "wall_s": wall,
        "peak_gib": top[0][0] / 2**20,
        "process": top[0][1],
        **validation,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budgets", nargs="+", default=["default", "3"])
    parser.add_argument("--puzzles", type=int, default=128)
    args, extra = parser.parse_known_args()
    import torch

    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {psutil.cpu_count()} cores")
    results = [run(budget, args.puzzles, extra) for budget in args.budgets]
    first = results[0]
    for r in results:
        print(
            f"kv_cache_gb {r['budget']:>8}: {r['wall_s']:6.1f} s ({r['wall_s'] / first['wall_s']:.2f}x), "
            f"peak {r['peak_gib']:.2f} GiB in {r['process']!r}"
        )
        print("    " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(r.items()) if k.startswith("val")))


if __name__ == "__main__":
    main()
