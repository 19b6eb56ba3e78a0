"""`grl plot <run dir>`: the curves a researcher reads, as PNG, from the run's metrics.jsonl.

One figure, one panel per quantity: success per task (training solid, validation dashed), reward,
response length, KL and entropy. The trainer calls `plot_run` after each validation so the picture
in the run folder is never older than the last validation.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from grl.tracking import METRICS_FILE, read_jsonl

CURVES_FILE = "curves.png"

# Panel title -> metric names drawn in it (those present in the log).
PANELS: dict[str, tuple[str, ...]] = {
    "reward": ("reward/mean", "val-env/reward/mean"),
    "response length (tokens)": ("response_length/mean",),
    "KL": ("actor/ppo_kl", "actor/kl_loss", "kl/in_reward"),
    "entropy": ("actor/entropy",),
}


def _series(rows: list[dict], name: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for row in rows:
        value = row.get(name)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(int(row["step"]))
            values.append(float(value))
    return steps, values


def success_metrics(rows: list[dict]) -> list[str]:
    names = {name for row in rows for name in row
             if name.startswith(("env/", "val-env/")) and name.endswith("/success")}
    return sorted(names, key=lambda n: (n.split("/", 1)[1], n.startswith("val-env/")))


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw the curves of one run into `out` (default: <run dir>/curves.png)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works without a display
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.exists():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir}")
    rows = [row for row in read_jsonl(metrics_path) if "step" in row]
    out = Path(out) if out else run_dir / CURVES_FILE

    panels = {"success": success_metrics(rows)}
    panels.update({title: tuple(n for n in names if any(n in row for row in rows)) for title, names in PANELS.items()})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (title, names) in zip(axes[0], panels.items()):
        for name in names:
            steps, values = _series(rows, name)
            if steps:
                style = "--" if name.startswith("val-env/") else "-"
                ax.plot(steps, values, style, marker="o" if len(steps) < 30 else None, markersize=3,
                        label=name.removesuffix("/success"))
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)  # a viewer never sees a half-written picture
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grl plot", description="Plot a run's curves from its metrics.jsonl.")
    parser.add_argument("run_dir", help="the run folder (trainer.run_dir), holding metrics.jsonl")
    parser.add_argument("--out", default=None, help=f"PNG to write (default: <run_dir>/{CURVES_FILE})")
    args = parser.parse_args(argv)
    try:
        path = plot_run(args.run_dir, args.out)
    except FileNotFoundError as err:
        print(f"grl plot: {err}")
        return 2
    print(path)
    return 0
