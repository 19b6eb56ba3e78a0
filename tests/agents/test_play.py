"""`grl play`: a human (here, a pipe) plays a task through the same messages the model sees."""

import json
import subprocess
import sys

import pytest

import grl.envs
from grl.envs.solvers import solve_sokoban

from agent_text import GSM8K_TEST, ROOT


def grl_cli(*args, stdin=""):
    return subprocess.run(
        [sys.executable, "-m", "grl.cli", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_play_sokoban_with_bfs_replies():
    seed, plan = next(
        (s, p)
        for s in range(50)
        if len(p := solve_sokoban(grl.envs.make("sokoban", dim_room=[6, 6]).reset(s))) <= 10
    )
    replies = "".join(
        f"<think>bfs</think><answer>{' || '.join(plan[i : i + 5])}</answer>\n" for i in range(0, len(plan), 5)
    )
    out = grl_cli("play", "simpleSokobanAgent", "--seed", str(seed), stdin=replies)
    assert out.returncode == 0, out.stderr
    start = grl.envs.make("sokoban", dim_room=[6, 6]).reset(seed)
    assert "[system]" in out.stdout and "[user]" in out.stdout and start in out.stdout
    assert "done True" in out.stdout and "success True" in out.stdout
    assert "episode reward" in out.stdout and "success 1" in out.stdout
    solved = grl.envs.make("sokoban", dim_room=[6, 6])
    solved.reset(seed)
    for action in plan:
        final = solved.step(action)[0]
    assert f"[final state]\n{final}\n" in out.stdout
    assert "verdict: SUCCESS: the task is solved" in out.stdout


@pytest.mark.shared_data("gsm8k/test.jsonl")
def test_play_gsm8k_from_a_local_jsonl_with_a_multiline_reply():
    row = json.loads(GSM8K_TEST.read_text(encoding="utf-8").splitlines()[3])
    gold = row["answer"].rsplit("####", 1)[1].strip()
    out = grl_cli(
        "play",
        "gsm8kAgent_5_turn",
        f"gsm8kAgent_5_turn.env_config.data_path={GSM8K_TEST}",
        "gsm8kAgent_5_turn.env_config.split=test",
        "--seed",
        "3",
        stdin=f"I think it is 0.5\n<answer>\\\n{gold}</answer>\n",
    )
    assert out.returncode == 0, out.stderr
    assert row["question"].strip() in out.stdout
    assert "0.5 is not the right answer" in out.stdout and "Attempts left: 4." in out.stdout
    assert out.stdout.count("=> reward") == 2 and "=> reward 10  done True" in out.stdout
    assert "verdict: SUCCESS" in out.stdout


def test_play_shows_the_verdict_when_the_budget_is_spent():
    out = grl_cli(
        "play",
        "tetrisAgent_type_1_dim_4",
        "tetrisAgent_type_1_dim_4.agent_config.max_turns=1",
        stdin="<think>x</think><answer>Left</answer>\n",
    )
    assert out.returncode == 0, out.stderr
    assert (
        "[final state]" in out.stdout
        and "verdict: FAILED: the turn or action budget (1 turn(s)) is spent" in out.stdout
    )


def test_play_math500_on_a_fixture_file(tmp_path):
    rows = [{"problem": "What is $\\frac{1}{2}+\\frac{1}{4}$?", "answer": "\\frac{3}{4}", "level": 1}]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = grl_cli(
        "play",
        "math500Agent_single_turn",
        f"math500Agent_single_turn.env_config.data_path={path}",
        stdin="<think>add</think><answer>0.75</answer>\n",
    )
    assert out.returncode == 0, out.stderr
    assert rows[0]["problem"] in out.stdout and "=> reward 10  done True" in out.stdout
    missing = grl_cli(
        "play",
        "math500Agent_single_turn",
        f"math500Agent_single_turn.env_config.data_path={tmp_path}/no.jsonl",
    )
    assert missing.returncode == 2 and "scripts/install_dataset.sh --math" in missing.stderr
    assert missing.stderr.strip().count("\n") == 0


def test_play_stops_cleanly_at_end_of_input():
    out = grl_cli("play", "tetrisAgent_type_1_dim_4", stdin="<think>x</think><answer>Left</answer>\n")
    assert (
        out.returncode == 0 and "no more input" in out.stdout and "=> reward -0.1  done False" in out.stdout
    )


def test_play_unknown_task_is_one_clear_line():
    out = grl_cli("play", "simpleSokobanAgnet")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0
    assert "simpleSokobanAgnet" in out.stderr and "simpleSokobanAgent" in out.stderr


def test_dispatcher(capsys):
    from grl.cli import main

    assert main(["--help"]) == 0 and "grl play" in capsys.readouterr().out
    assert main([]) == 2
    assert main(["tarin"]) == 2 and "unknown command 'tarin'" in capsys.readouterr().err


@pytest.mark.slow
def test_play_textworld_lists_valid_commands_on_help_and_wins_by_the_walkthrough():
    env = grl.envs.make("textworld", level="easy")
    env.reset(4)
    valid, plan = env.valid_actions(), env.walkthrough()
    env.close()
    replies = "help\n" + "".join(f"<answer>{command}</answer>\n" for command in plan)
    out = grl_cli("play", "textworldAgent_easy", "--seed", "4", stdin=replies)
    assert out.returncode == 0, out.stderr
    listing = out.stdout.split("valid actions", 1)[1].split("[assistant]", 1)[0]
    assert all(f"\n  {command}\n" in listing for command in valid)
    assert out.stdout.count("=> reward") == len(plan)
    assert "done True" in out.stdout and "success True" in out.stdout and "success 1" in out.stdout


def test_play_takes_flags_and_overrides_in_any_order():
    out = grl_cli("play", "simpleSokobanAgent", "--seed", "1", "simpleSokobanAgent.env_config.num_boxes=2")
    assert out.returncode == 0, out.stderr
    two_boxes = grl.envs.make("sokoban", dim_room=[6, 6], num_boxes=2).reset(1)
    assert "task simpleSokobanAgent, seed 1:" in out.stdout and two_boxes in out.stdout


def test_play_usage_is_the_line_grl_help_gives(capsys):
    from grl.cli import main

    assert main(["--help"]) == 0
    overview = capsys.readouterr().out
    out = grl_cli("play")
    assert out.returncode == 2 and out.stdout == ""
    usage, error = out.stderr.strip().splitlines()
    assert usage.startswith("usage: grl play ") and usage.removeprefix("usage: ") in overview, (
        usage,
        overview,
    )
    assert "overrides" not in error and "name a task instance" in error and "grl list" in error
