"""scripts/logprob_gate.py, the check of gpu_smoke.sh's run, on fabricated metrics.jsonl files: it passes a
sound run whose largest gap is large (many tokens, a near-tie), and fails a run whose weights are wrong,
whose tail is wrong, or that logged nothing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / "scripts" / "logprob_gate.py"
MEAN, P99, MAX = (f"training/rollout_logprob_diff_{stat}" for stat in ("mean", "p99", "max"))


def run_gate(tmp_path, records, *args):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return subprocess.run([sys.executable, str(GATE), str(path), *args], capture_output=True, text=True, timeout=60)


def step(n, **gaps):
    return {"step": n, "perf/time_per_step": 30.0, **gaps}


def test_a_sound_run_with_one_far_token_passes(tmp_path):
    """A maximum of 2.5 nats failed the old gate (max <= 1 nat); the mean and p99 are those of a sound pair."""
    result = run_gate(tmp_path, [step(1, **{MEAN: 0.5, P99: 3.0}), step(2, **{MEAN: 0.03, P99: 0.4, MAX: 2.5})])
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and "step 2:" in result.stdout and result.stderr == ""


@pytest.mark.parametrize(
    "gaps, named",
    [
        ({MEAN: 1.7, P99: 6.0}, [MEAN, P99]),  # weights or buffers lost in the reload: every token moves
        ({MEAN: 0.06, P99: 1.4}, [P99]),  # a tail of tokens far apart, the mean still small
        ({MEAN: 0.15, P99: 0.8}, [MEAN]),
        ({MEAN: float("nan"), P99: 0.2}, [MEAN]),
    ],
)
def test_a_gap_above_its_limit_fails_in_one_line_naming_it(tmp_path, gaps, named):
    result = run_gate(tmp_path, [step(1, **{MEAN: 0.01, P99: 0.1}), step(2, **gaps)])
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert [key for key in (MEAN, P99) if f"{key} " in result.stderr] == named


def test_a_run_without_the_figures_fails(tmp_path):
    only_verl = step(2, **{"training/rollout_probs_diff_mean": 0.001, "training/rollout_probs_diff_max": 0.02})
    for records in ([], [step(1, **{MEAN: 0.01, P99: 0.1})], [only_verl], [step(2, **{MEAN: 0.01})]):
        result = run_gate(tmp_path, records)
        assert result.returncode == 1 and "step 2 logged no" in result.stderr, records
    assert run_gate(tmp_path, [], "--step", "3").stderr.startswith("step 3 logged no")
