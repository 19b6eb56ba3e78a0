"""The kit run's one summary: stage results, per-step phase times, the rollout/trainer log-prob agreement,
measured peaks beside `grl plan`, and the lines of the logs that show what ran. Prints it and writes it as
a Markdown block for docs/PERFORMANCE.md to OUT/report.md (run.py calls this in the kit's environment).

    python scripts/gpu_kit/report.py OUT     # OUT holds run.py's summary.json and the stage logs

Exit status 1 when the run left no metrics (the figures could not be read), else 0.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

GIB = 2**30
PHASE_TIMES = [
    "step",
    "gen",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "sync_weights",
    "save_checkpoint",
    "testing",
]
CRITIC_PHASES = {"values", "update_critic"}  # the phases the critic's process computes in
ACTOR_STATE = ("actor", "ref ", "engine", "cached by the actor", "sync buffers")
EVIDENCE = re.compile(
    r"group|rollout engine|placement|bundle|resumed|checkpoint |HF export|NCCL|nccl|Traceback|Error"
)


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def steps_of(metrics: list[dict]) -> dict[int, dict]:
    """The last record of each training step (a resumed run may log a step again), merged with its
    validation record."""
    steps: dict[int, dict] = {}
    for record in metrics:
        if "step" in record:
            steps.setdefault(record["step"], {}).update(record)
    return {step: record for step, record in sorted(steps.items()) if "timing_s/step" in record}


def fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def owner(component: str, phase: str) -> str:
    """Which process of a one-GPU colocated run holds a plan row in a phase: actor, critic or shared."""
    if component.startswith("runtime"):
        return "shared"
    if "critic" in component:
        return "critic"
    if phase in CRITIC_PHASES and not component.startswith(ACTOR_STATE):
        return "critic"
    return "actor"


def plan_figures(overrides: list[str], seq_len: int | None, sampled: int | None) -> dict:
    """Per phase: GiB per GPU in total and by process (actor rank with reference and engine, critic rank)."""
    from grl.config import load_config, run_sections
    from grl.planner import plan_run

    plan = plan_run(run_sections(load_config(overrides)), seq_len=seq_len, sampled_tokens=sampled)
    phases = {}
    for phase in plan.phases:
        split = {"actor": 0.0, "critic": 0.0, "shared": 0.0}
        for component, row in plan.device.items():
            split[owner(component, phase)] += row.get(phase, 0.0) / GIB
        phases[phase] = dict(split, total=plan.device_total(phase) / GIB)
    return {
        "title": plan.title,
        "phases": phases,
        "capacity_gib": (plan.capacity or 0) / GIB,
        "overflow": plan.overflow(),
    }


def versions() -> str:
    import importlib.metadata as md

    import torch

    cuda = f" (CUDA {torch.version.cuda})" if torch.version.cuda else ""
    return f"torch {torch.__version__}{cuda}, " + ", ".join(
        f"{n} {md.version(n)}" for n in ("transformers", "ray", "hydra-core")
    )


def log_lines(path: Path, pattern: re.Pattern, limit: int) -> list[str]:
    if not path.exists():
        return []
    text = path.read_text(errors="replace").replace("\r", "\n")
    lines = [
        line.strip() for line in text.splitlines() if pattern.search(line) and not line.startswith("===")
    ]
    return [line[:200] for line in lines[:limit]]


def memory_rows(stages: dict) -> list[str]:
    rows = []
    for stage in ("vllm", "train", "resume"):
        memory = stages.get(stage, {}).get("memory")
        if not memory:
            continue
        by_role: dict[str, float] = {}
        for proc in memory["processes"]:
            by_role[proc["role"]] = max(by_role.get(proc["role"], 0.0), proc["peak_gib"])
        named = ", ".join(
            f"{role} {peak:.2f}" for role, peak in sorted(by_role.items(), key=lambda kv: -kv[1])[:5]
        )
        rows.append(
            f"| {stage} ({memory['source']}, {memory['samples']} samples) | {memory['device_peak_gib']:.2f} "
            f"| {named} |"
        )
    return rows


def step_tables(steps: dict[int, dict], note: str) -> list[str]:
    """Per-step phase times, and the engine's vs the trainer's log-probs (mean, p99, max; verl's |Δp|)."""
    lines = []
    if not steps:
        return lines
    diffs = sorted(
        {k for r in steps.values() for k in r if k.startswith("training/rollout_") and "diff" in k}
    )
    times = [f"timing_s/{p}" for p in PHASE_TIMES]
    for title, columns in (
        (f"Phase times, seconds per step (`metrics.jsonl`; {note}):", times),
        (
            "The engine's and the trainer's log-probs of the sampled tokens, and the actor rank's allocator "
            "peak:",
            diffs + ["perf/max_memory_allocated_gb", "seq_length/max"],
        ),
    ):
        columns = [c for c in columns if any(c in r for r in steps.values())]
        header = (
            "| step | " + " | ".join(f"`{c.split('/', 1)[1] if c in times else c}`" for c in columns) + " |"
        )
        lines += ["", title, "", header, "|---" * (len(columns) + 1) + "|"]
        lines += [
            "| " + " | ".join([str(s)] + [fmt(r.get(c)) for c in columns]) + " |" for s, r in steps.items()
        ]
    return lines


VLLM_LINES = re.compile(
    r"KV cache memory|KV cache size|Maximum concurrency|Sleep mode freed|sleep freed|Model loading took"
)


def vllm_section(out: Path, summary: dict, stages: dict) -> tuple[list[str], dict]:
    """The vLLM stage: its steps' tables, what vLLM logged of its KV cache and sleeps, and `grl plan`."""
    run_dir = summary.get("vllm_run_dir")
    if not run_dir:
        return [], {}
    steps = steps_of(read_metrics(Path(run_dir)))
    lines = ["", "#### vLLM stage (the colocated vLLM engine: sleep, wake, weight reload)"]
    lines += step_tables(steps, "`gen` includes the wake, `sync_weights` the weights' wake and reload")
    logged = log_lines(out / "vllm.log", VLLM_LINES, 12)
    if logged:
        lines += ["", "What vLLM logged of its KV cache, load and sleeps:", "", "```", *logged, "```"]
    figures = {"steps": steps}
    try:
        plan = plan_figures(summary["vllm_overrides"], None, None)
        figures["plan"] = plan
        lines += ["", f"`grl plan` for the vLLM stage's config, GiB per GPU: {plan['title']}", ""]
        lines += [
            f"- {phase}: {v['total']:.2f} (actor rank {v['actor']:.2f}, critic rank {v['critic']:.2f})"
            for phase, v in plan["phases"].items()
        ]
    except Exception as err:  # noqa: BLE001 - the report still prints what it measured
        lines += ["", f"`grl plan` (vLLM stage) failed: {err.__class__.__name__}: {err}"]
    return lines, figures


def build(out: Path) -> tuple[list[str], dict]:
    summary = json.loads((out / "summary.json").read_text())
    stages, run_dir = summary["stages"], Path(summary["run_dir"])
    metrics = read_metrics(run_dir)
    if metrics:
        shutil.copyfile(run_dir / "metrics.jsonl", out / "metrics.jsonl")
    steps = steps_of(metrics)
    unit = "GPU" if summary["mode"] == "cuda" else "CPU rank"
    kit = summary["kit"]
    lines = [
        f"### GPU proof kit, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} ({summary['mode']} mode)",
        "",
        f"{summary['machine']}. {versions()}. Kit: {len(kit['parts'])} parts, "
        f"{kit['archive']['size'] / 2**20:.1f} MiB "
        f"for {kit['target']}.",
        "",
        "| stage | result | seconds |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {result['status']} | {result['seconds']:.1f} |" for name, result in stages.items()]
    lines += step_tables(steps, "step 3 is the resumed run" + "'s")
    longest = max((int(r["seq_length/max"]) for r in steps.values() if "seq_length/max" in r), default=None)
    sampled = max(
        (int(r["response_length/max"]) for r in steps.values() if "response_length/max" in r), default=None
    )
    figures = {"steps": steps, "plan": {}}
    shapes = [("config's longest episode", None, None)]
    if longest:
        shapes.append((f"the run's longest episode, {longest} tokens", longest, sampled))
    for label, seq, samp in shapes:
        try:
            plan = plan_figures(summary["overrides"], seq, samp)
        except Exception as err:  # noqa: BLE001 - the report still prints what it measured
            lines += ["", f"`grl plan` ({label}) failed: {err.__class__.__name__}: {err}"]
            continue
        figures["plan"][label] = plan
        lines += [
            "",
            f"`grl plan` for the run's config ({label}), GiB per {unit}: {plan['title']}",
            "",
            "| phase | total | actor rank (+ref, engine) | critic rank | runtime |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {phase} | {v['total']:.2f} | {v['actor']:.2f} | {v['critic']:.2f} | {v['shared']:.2f} |"
            for phase, v in plan["phases"].items()
        ]
    rows = memory_rows(stages)
    if rows:
        how = (
            "NVML: the device's used memory, each process's"
            if unit == "GPU"
            else "resident memory: the run's tree, each process"
        )
        lines += [
            "",
            f"Measured peaks, GiB ({how}; PolicyWorker is the actor rank, CriticWorker the critic rank):",
            "",
            f"| run | whole {unit if unit == 'GPU' else 'tree'} | by process |",
            "|---|---|---|",
            *rows,
        ]
    evidence = log_lines(out / "train.log", EVIDENCE, 24)
    if evidence:
        lines += [
            "",
            "What the runs logged (placement, checkpoints, resume, export):",
            "",
            "```",
            *evidence,
            "```",
        ]
    checks = log_lines(out / "gpu_parts.log", re.compile(r"^(ok  |FAIL)"), 12)
    if checks:
        lines += ["", "`scripts/gpu_parts.py`:", "", "```", *checks, "```"]
    figures["stages"] = stages
    vllm_lines, figures["vllm"] = vllm_section(out, summary, stages)
    return lines + vllm_lines, figures


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    lines, figures = build(out)
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    summary = json.loads((out / "summary.json").read_text())
    summary["figures"] = figures
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(text, flush=True)
    return 0 if figures["steps"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
