"""`grl plot <run dir>`: the curves a researcher reads, from the run's metrics.jsonl.

A grid of panels: success and reward per task (training solid, validation dashed, validation shown a
decoy board dotted, one colour per task in every panel), the validation answers' dependence on their
input (input_mi), actor and critic losses, KL, entropy, grad norm, response length and the time per
phase of a step; a panel with nothing logged is left out. Training curves are smoothed (an exponential moving
average, the raw
values drawn faintly behind); validation points are few and drawn as they are. Every point is marked
while a series is short, so a run is readable from its first step (a line of one point draws nothing).
The trainer draws `curves.png` after its first logged step, then once a minute and at the end.

`grl plot RUN RUN ... --out compare.png` draws several runs on one figure instead (`compare_runs`): each
validation task's success (and its decoy arm) by step and by the run's minutes, one colour per run, to set
two methods from the same start side by side (RL and on-policy distillation, docs/RESULTS.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from grl.tracking import METRICS_FILE, read_jsonl

CURVES_FILE = "curves.png"
COLUMNS = 3
TRAIN_PREFIXES = ("env/", "train/")  # GRL's name is train/<task>/...; older runs logged env/<task>/...
VAL_PREFIX = "val-env/"
TIMING_PREFIXES = ("timing_s/", "timing/")
MARKED_POINTS = 60  # up to this many points a series marks each one; beyond, markers would hide the line

# Panel title -> metric names drawn in it (those present in the log).
PANELS: dict[str, tuple[str, ...]] = {
    "actor loss": ("actor/pg_loss", "actor/kl_loss"),
    "critic loss": ("critic/vf_loss",),
    "KL": ("actor/ppo_kl", "actor/reward_kl_penalty", "kl/in_reward"),
    "KL to the teacher (nats)": ("teacher/reverse_kl_per_token", "teacher/reverse_kl_per_turn"),
    "entropy": ("actor/entropy",),
    "grad norm": ("actor/grad_norm", "critic/grad_norm"),
    "response length (tokens)": ("response_length/mean",),
}


class EmptyMetrics(ValueError):
    """A metrics file that is missing or holds no step."""


def _series(rows: list[dict], name: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for row in rows:
        value = row.get(name)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(int(row["step"]))
            values.append(float(value))
    return steps, values


def smooth(values: list[float], weight: float) -> list[float]:
    """Debiased exponential moving average (TensorBoard's smoothing); weight 0 returns the values."""
    out, avg = [], 0.0
    for k, value in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * value
        out.append(avg / (1 - weight**k) if weight < 1 else value)
    return out


def task_metrics(rows: list[dict], metric: str) -> dict[str, list[str]]:
    """Task -> its training and validation metric names for `metric` (`success`, `score`)."""
    tasks: dict[str, list[str]] = {}
    for name in sorted({n for row in rows for n in row}):
        for prefix in (*TRAIN_PREFIXES, VAL_PREFIX):
            if name.startswith(prefix) and name.endswith(f"/{metric}") and name.count("/") == 2:
                tasks.setdefault(name.split("/")[1], []).append(name)
    return {
        task: sorted(names, key=lambda n: n.startswith(VAL_PREFIX)) for task, names in sorted(tasks.items())
    }


def success_metrics(rows: list[dict]) -> list[str]:
    return [name for names in task_metrics(rows, "success").values() for name in names]


def load_rows(metrics_path: Path) -> list[dict]:
    if not metrics_path.is_file():
        raise EmptyMetrics(f"{metrics_path}: no such file (is this a run folder, trainer.run_dir?)")
    rows = [row for row in read_jsonl(metrics_path) if "step" in row]
    if not rows:
        raise EmptyMetrics(f"{metrics_path}: holds no logged step yet")
    return rows


def plot_run(run_dir: str | Path, out: str | Path | None = None, smoothing: float = 0.6) -> Path:
    """Draw the curves of one run into `out` (default: <run dir>/curves.png);
    the format follows the suffix of `out` (png, pdf, svg, ...)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works without a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    run_dir = Path(run_dir)
    rows = load_rows(run_dir / METRICS_FILE)
    out = Path(out) if out else run_dir / CURVES_FILE

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    by_task = {"success": task_metrics(rows, "success"), "reward": task_metrics(rows, "score")}
    tasks = sorted({t for names in by_task.values() for t in names})
    colour_of = {task: colours[k % len(colours)] for k, task in enumerate(tasks)}
    panels: dict[str, list[tuple[str, str, str | None]]] = {}  # title -> (metric, label, colour)
    for title, names in by_task.items():
        panels[f"{title} per task"] = [
            (n, n.rsplit("/", 1)[0], colour_of[n.split("/")[1]])
            for task_names in names.values()
            for n in task_names
        ]
    # The proof that the policy reads its input: success shown a decoy board stays low, and the answers
    # carry information about the observation (RAGEN-2's input_mi).
    for title, metric in (
        ("success per task", "success_swapped"),
        ("input_mi (nats, validation)", "input_mi"),
    ):
        panels.setdefault(title, []).extend(
            (
                n,
                f"{n.rsplit('/', 1)[0]} decoy board" if metric == "success_swapped" else n.rsplit("/", 1)[0],
                colour_of.get(n.split("/")[1]),
            )
            for task_names in task_metrics(rows, metric).values()
            for n in task_names
        )
    for title, names in PANELS.items():
        panels[title] = [(n, n, None) for n in names if any(n in row for row in rows)]
    timing = sorted({n for row in rows for n in row if n.startswith(TIMING_PREFIXES)})
    # The rollout's time beside its parts (grl/rollout/clock.py), the other phases apart.
    generation = [n for n in timing if n.split("/", 1)[1].startswith("gen")]
    panels["time per phase (s)"] = [(n, n.split("/", 1)[1], None) for n in timing if n not in generation]
    panels["generation: engine, env, other (s)"] = [(n, n.split("/", 1)[1], None) for n in generation]
    # A panel with nothing logged (a critic-free run's critic loss) gives its place to the next.
    panels = {
        title: curves
        for title, curves in panels.items()
        if any(_series(rows, name)[0] for name, _, _ in curves)
    } or {"success per task": []}

    n_rows = math.ceil(len(panels) / COLUMNS)
    fig, axes = plt.subplots(n_rows, COLUMNS, figsize=(5.2 * COLUMNS, 3.4 * n_rows), squeeze=False)
    for ax, (title, curves) in zip(axes.flat, panels.items()):
        for name, label, colour in curves:
            steps, values = _series(rows, name)
            if not steps:
                continue
            if name.startswith(VAL_PREFIX):
                style = ":" if name.endswith("_swapped") else "--"
                ax.plot(steps, values, style, marker="o", markersize=3, color=colour, label=label)
                continue
            marker = "o" if len(steps) <= MARKED_POINTS else None
            (line,) = ax.plot(
                steps, smooth(values, smoothing), "-", marker=marker, markersize=3, color=colour, label=label
            )
            if smoothing > 0 and len(values) > 1:
                ax.plot(steps, values, "-", color=line.get_color(), alpha=0.25, linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        low, high = ax.get_xlim()
        if high - low < 2:  # one or two steps: out to the whole steps either side, not 0.96 .. 1.04
            ax.set_xlim(math.floor(low), math.ceil(high))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"{run_dir.name}  (training smoothed {smoothing:g}, validation dashed)")
    fig.tight_layout()
    tmp = out.with_name(f".tmp-{out.name}")
    fig.savefig(tmp, dpi=110, format=out.suffix.lstrip(".") or "png")
    plt.close(fig)
    tmp.replace(out)  # a viewer never sees a half-written picture
    return out


def minutes(rows: list[dict]) -> list[float]:
    """Each row's minutes into the run: its steps' and validations' times summed (start-up left out)."""
    total, out = 0.0, []
    for row in rows:
        total += row.get("timing_s/step", 0.0) + row.get("timing_s/testing", 0.0)
        out.append(total / 60)
    return out


def compare_runs(run_dirs: list[str | Path], out: str | Path, labels: list[str] | None = None) -> Path:
    """Validation success of several runs, by step and by minutes, into `out`; `labels` name the runs
    (default: their folders' names)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_rows(Path(d) / METRICS_FILE) for d in run_dirs]
    labels = labels or [Path(d).name for d in run_dirs]
    if len(labels) != len(runs):
        raise ValueError(f"--labels: {len(labels)} labels for {len(runs)} runs")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), squeeze=False)
    for k, (rows, label) in enumerate(zip(runs, labels)):
        clock = dict(zip((row["step"] for row in rows), minutes(rows)))
        for task_names in task_metrics(rows, "success").values():
            for name in task_names:
                if not name.startswith(VAL_PREFIX):
                    continue
                for metric, style, suffix in ((name, "-", ""), (f"{name}_swapped", ":", ", decoy board")):
                    steps, values = _series(rows, metric)
                    if not steps:  # a run without the decoy control
                        continue
                    for ax, xs in ((axes[0][0], steps), (axes[0][1], [clock[s] for s in steps])):
                        ax.plot(
                            xs,
                            values,
                            style,
                            marker="o",
                            markersize=3,
                            color=colours[k % len(colours)],
                            label=f"{label}{suffix}",
                        )
    for ax, xlabel in zip(axes[0], ("step", "minutes (steps and validations)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation success")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110, format=out.suffix.lstrip(".") or "png")
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="grl plot", description="Plot a run's curves from its metrics.jsonl, or compare several runs."
    )
    parser.add_argument(
        "run_dir", nargs="+", help="the run folder (trainer.run_dir), holding metrics.jsonl; several: compare"
    )
    parser.add_argument("--labels", nargs="+", default=None, help="the compared runs' names, in order")
    parser.add_argument(
        "--out",
        default=None,
        help="file to write; its suffix picks the format: .png, .pdf, .svg (default: "
        f"<run_dir>/{CURVES_FILE})",
    )
    parser.add_argument(
        "--smooth", type=float, default=0.6, help="EMA weight of the training curves, 0 (raw) to <1"
    )
    args = parser.parse_args(argv)
    if not 0 <= args.smooth < 1:
        parser.error(f"--smooth: {args.smooth} is not in [0, 1)")
    if len(args.run_dir) > 1 and not args.out:
        parser.error("several runs: name the picture with --out")
    try:
        if len(args.run_dir) > 1:
            path = compare_runs(args.run_dir, args.out, args.labels)
        else:
            path = plot_run(args.run_dir[0], args.out, args.smooth)
    except (EmptyMetrics, ValueError) as err:
        print(f"grl plot: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0
