#!/usr/bin/env bash
# The first run on a machine with an NVIDIA GPU: proves the CUDA path end to end and records its figures.
#
#   bash env_setup.sh && bash scripts/gpu_smoke.sh
#   DRY_RUN=1 bash scripts/gpu_smoke.sh      # print the steps' commands; runs nothing, needs no GPU
#
# Steps (each logged under outputs/gpu_smoke/<UTC time>/, a failing step does not stop the next):
#   1. tests/gpu: engine sleep/wake, the colocated weight sync, vLLM with and without the reply grammar
#   2. `grl plan`, then a 2-step run of preset=a100_1x_0.5b on the embedded model with small groups
#      (Ray, FSDP2 actor and critic, colocated vLLM, checkpoint and HF export), in its own run folder
#   3. the benchmarks that run on CUDA: bench_generation.py (hf vs vllm; picks CUDA itself) and
#      bench_gae.py --device cuda
# and a check of the run: step 2's engine/trainer log-prob gaps (`training/rollout_logprob_diff_mean` and
# `_p99`) within the limits of scripts/logprob_gate.py, which says why each limit is what it is.
# Then the "## GPU smoke" section of docs/PERFORMANCE.md is replaced by this run's date, machine,
# driver, GPU and figures. Exit status 0 when every step passed, 1 when one failed, 2 without a GPU.

set -uo pipefail
set -f  # the steps' commands are split into words unquoted; `[4]` in an override must not glob
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-.venv/bin/python}"
OUT="${GRL_SMOKE_DIR:-outputs/gpu_smoke/$(date -u +%Y%m%dT%H%M%SZ)}"
TRAIN_OVERRIDES=(
    preset=a100_1x_0.5b model_path=embedded experiment_name=gpu_smoke
    total_training_steps=2 test_freq=2 resume_mode=disable
    "rollout.agent_group_num=[4]" "rollout.agent_group_size=[4]"
    "rollout.validation_agent_group_num=[16]" "rollout.validation_agent_group_size=[1]"
    ppo_mini_batch_size=4 micro_batch_size_per_gpu=2
    "trainer.logger=[console,jsonl]" trainer.gpu_memory_gb=null
    "trainer.run_dir=$OUT/run" "trainer.default_local_dir=$OUT/checkpoints"
)
STEPS=(tests plan train bench_generation bench_gae)

command_of() {
    case "$1" in
        tests) echo "$PY -m pytest -q -p no:cacheprovider tests/gpu" ;;
        plan) echo "$PY -m grl.cli plan ${TRAIN_OVERRIDES[*]}" ;;
        train) echo "$PY -m grl.train ${TRAIN_OVERRIDES[*]}" ;;
        bench_generation) echo "$PY bench/bench_generation.py --batch-sizes 1 8 32 --new-tokens 64" ;;
        bench_gae) echo "$PY bench/bench_gae.py --device cuda" ;;
    esac
}

if [ "${DRY_RUN:-0}" = 1 ]; then
    for step in "${STEPS[@]}"; do command_of "$step"; done
    exit 0
fi

gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)" || gpu=""
gpu="${gpu%%$'\n'*}"
if [ -z "$gpu" ]; then
    echo "gpu_smoke: no NVIDIA GPU here (nvidia-smi is absent or lists none); nothing to run" >&2
    exit 2
fi
if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    IFS=, read -r name driver memory <<< "$gpu"
    echo "gpu_smoke: nvidia-smi sees $name (driver${driver},${memory}), but $PY's torch cannot use it; run bash env_setup.sh (it installs the build this driver runs)" >&2
    exit 2
fi

mkdir -p "$OUT"
declare -A status
for step in "${STEPS[@]}"; do
    cmd="$(command_of "$step")"
    echo "gpu_smoke: $step: $cmd"
    start=$SECONDS
    # Word splitting of $cmd is wanted (the overrides hold no spaces); set -f keeps it from globbing.
    $cmd > "$OUT/$step.log" 2>&1
    status[$step]="exit $? in $((SECONDS - start)) s"
    echo "gpu_smoke: $step: ${status[$step]}"
done

"$PY" scripts/logprob_gate.py "$OUT/run/metrics.jsonl" --step 2 > "$OUT/logprob_gate.log" 2>&1
status[logprob_gate]="exit $? ($(tail -n 1 "$OUT/logprob_gate.log"))"
echo "gpu_smoke: logprob_gate: ${status[logprob_gate]}"
CHECKED=("${STEPS[@]}" logprob_gate)

for step in "${CHECKED[@]}"; do printf '%s\t%s\n' "$step" "${status[$step]}"; done > "$OUT/status.tsv"
GPU="$gpu" OUT="$OUT" HOST="$(hostname)" "$PY" - <<'EOF'
"""Replace the GPU smoke section of docs/PERFORMANCE.md with this run's figures."""
import json
import os
import re
import time
from pathlib import Path

import torch

out = Path(os.environ["OUT"])
status = dict(line.split("\t") for line in (out / "status.tsv").read_text().splitlines())


def tail(step: str, lines: int) -> str:
    text = (out / f"{step}.log").read_text(errors="replace").rstrip().splitlines()
    return "\n".join(text[-lines:])


def version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "absent"


name, driver, memory = (part.strip() for part in os.environ["GPU"].split(","))
section = [
    "## GPU smoke",
    "",
    f"`bash scripts/gpu_smoke.sh`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, host "
    f"{os.environ['HOST']}: {name} ({memory}), driver {driver}, torch {torch.__version__} (CUDA "
    f"{torch.version.cuda}), vllm {version('vllm')}, transformers {version('transformers')}. Logs: `{out}/`.",
    "",
    "| step | result |",
    "|---|---|",
    f"| `pytest tests/gpu` | {status['tests']}: {tail('tests', 1)} |",
    f"| `grl plan` (the run's config) | {status['plan']} |",
    f"| 2-step run, preset=a100_1x_0.5b, embedded model, 4×4 agents | {status['train']} |",
    f"| `bench/bench_generation.py` | {status['bench_generation']} |",
    f"| `bench/bench_gae.py --device cuda` | {status['bench_gae']} |",
    f"| step 2 engine/trainer log-prob gap, mean and p99 (synced after a level-2 sleep) | {status['logprob_gate']} |",
]
metrics_file = out / "run" / "metrics.jsonl"
records = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
columns = ["perf/time_per_step", "timing_s/gen", "timing_s/update_actor", "timing_s/update_critic",
           "timing_s/sync_weights", "perf/throughput", "perf/mfu/actor", "perf/max_memory_allocated_gb",
           "training/rollout_logprob_diff_mean", "training/rollout_logprob_diff_p99",
           "training/rollout_logprob_diff_max", "training/rollout_probs_diff_mean"]
steps = [r for r in records if "perf/time_per_step" in r]
if steps:
    section += ["", "Training steps (`metrics.jsonl`):", "",
                "| step | " + " | ".join(f"`{c}`" for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    section += ["| " + " | ".join([str(r["step"])] + [f"{r[c]:.4g}" if c in r else "-" for c in columns]) + " |"
                for r in steps]
validations = [(r["step"], {k: v for k, v in r.items() if k.startswith("val-env/") and k.endswith("/success")})
               for r in records]
validations = [(step, found) for step, found in validations if found]
if validations:
    section += ["", "Greedy validation success: " + "; ".join(
        f"step {step}: " + ", ".join(f"`{k}` {v:.3g}" for k, v in sorted(found.items())) for step, found in validations)]
section += ["", "`grl plan` (prediction for the run above):", "", "```", tail("plan", 30), "```"]
section += ["", "`bench/bench_generation.py`:", "", "```", tail("bench_generation", 5), "```"]
section += ["", "`bench/bench_gae.py --device cuda`:", "", "```", tail("bench_gae", 8), "```"]
if not status["tests"].startswith("exit 0"):
    section += ["", "`tests/gpu` failures:", "", "```", tail("tests", 40), "```"]
if not status["train"].startswith("exit 0"):
    section += ["", "2-step run, end of its log:", "", "```", tail("train", 40), "```"]

doc = Path("docs/PERFORMANCE.md")
text = doc.read_text()
body = "\n".join(section) + "\n"
match = re.search(r"^## GPU smoke\n.*?(?=^## |\Z)", text, re.S | re.M)
text = text[:match.start()] + body + ("\n" if text[match.end():] else "") + text[match.end():] if match \
    else text.rstrip("\n") + "\n\n" + body
doc.write_text(text)
print(f"gpu_smoke: figures written to {doc} (section 'GPU smoke')")
EOF
[ $? -eq 0 ] || echo "gpu_smoke: could not write docs/PERFORMANCE.md (see above)" >&2

for step in "${CHECKED[@]}"; do
    case "${status[$step]}" in
        "exit 0 "*) ;;
        *) echo "gpu_smoke: $step failed, ${status[$step]}: $OUT/$step.log" >&2; exit 1 ;;
    esac
done
echo "gpu_smoke: every step passed"
