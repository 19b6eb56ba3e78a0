"""GSM8K env: answer extraction, gold parsing, loading, single- and multi-turn episodes."""

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

import grl.envs
from grl.envs import EnvUnavailable
from grl.envs.gsm8k import GSM8KEnv, extract_answer, gold_answer, load_problems

ROOT = Path(__file__).resolve().parents[2]
SHARED_TEST = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"


@pytest.fixture
def tiny(tmp_path):
    rows = [
        {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
        {"question": "How many cents in $12?", "answer": "12 * 100 = 1200\n#### 1,200"},
        {"question": "Half of 5?", "answer": "#### 2.5"},
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "text, value",
    [
        ("1000", "1000"),
        ("1,000", "1000"),
        ("$1,000", "1000"),
        ("1000.0", "1000"),
        (" 1000. ", "1000"),
        ("50%", "50"),
        ("-7", "-7"),
        (".5", "0.5"),
        ("so the answer is 18 dollars", "18"),
        ("3 apples and 4 pears: 7", "7"),
        ("between 3-5 days, so 5", "5"),
        ("It costs $1,450,000.", "1450000"),
        ("x = -4", "-4"),
    ],
)
def test_extract_answer(text, value):
    assert extract_answer(text) == Decimal(value)


@pytest.mark.parametrize("text", ["", "no number here", "   ", "$", "-", ".", None, 12])
def test_extract_answer_without_a_number(text):
    assert extract_answer(text) is None


def test_gold_answer():
    assert gold_answer("blah\n#### 1,600") == Decimal(1600)
    assert gold_answer("#### $5") == Decimal(5)
    assert gold_answer("no marker 5") is None


def test_single_turn_episode(tiny):
    env = grl.envs.make("gsm8k", data_path=str(tiny), split="test")
    assert env.reset(1) == "How many cents in $12?"
    obs, reward, done, info = env.step("1200.0")
    assert (reward, done, info["success"], info["action_is_valid"]) == (10.0, True, True, True)
    env.reset(1)
    obs, reward, done, info = env.step("1201")
    assert (reward, done, info["success"]) == (-0.1, True, False)


def test_multi_turn_feedback_and_custom_rewards(tiny):
    env = GSM8KEnv(data_path=str(tiny), split="test", max_attempts=3, correct_reward=1.0, wrong_reward=-1.0)
    assert env.reset(0) == "What is 2 + 3?"
    obs, reward, done, info = env.step("six")
    assert (reward, done, info["action_is_valid"]) == (-1.0, False, False)
    assert "No number" in obs and "2 attempts left" in obs and "What is 2 + 3?" in obs
    obs, reward, done, info = env.step("4")
    assert (reward, done) == (-1.0, False) and "4 is not the right answer" in obs
    obs, reward, done, info = env.step("5")
    assert (reward, done, info["success"], obs) == (1.0, True, True, "Correct.")


def test_attempts_run_out(tiny):
    env = GSM8KEnv(data_path=str(tiny), split="test", max_attempts=2)
    env.reset(2)
    assert env.step("1")[2] is False
    assert env.step("2")[2] is True
    obs, reward, done, info = env.step("2.5")  # the episode is over: no late success
    assert (reward, done, info["success"]) == (0.0, True, False)


def test_seed_picks_question(tiny):
    env = GSM8KEnv(data_path=str(tiny), split="test")
    assert [env.reset(s) for s in (0, 3, 4, 2)] == [env.reset(s) for s in (3, 0, 1, 5)]
    assert len({env.reset(s) for s in range(3)}) == 3


def test_folder_path_uses_split(tiny):
    env = GSM8KEnv(data_path=str(tiny.parent), split="test")
    assert env.reset(0) == "What is 2 + 3?"


def test_cache_per_path_and_split(tiny):
    assert load_problems(str(tiny), "test") is load_problems(str(tiny), "test")
    first, second = (GSM8KEnv(data_path=str(tiny), split="test") for _ in range(2))
    assert first.problems is second.problems


def test_missing_file_and_bad_rows(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.jsonl"):
        GSM8KEnv(data_path=str(tmp_path / "nothere.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": "no gold"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        GSM8KEnv(data_path=str(bad))
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"broken.jsonl:1: not JSON"):
        GSM8KEnv(data_path=str(broken))


def test_unreachable_hub_id_fails_with_one_clear_error():
    # Offline mode makes the (unreachable) hub fail at once instead of after retries.
    code = (
        "from grl.envs.gsm8k import GSM8KEnv\n"
        "try:\n    GSM8KEnv(data_path='hf:openai/gsm8k')\n"
        "except Exception as e:\n    print(type(e).__name__ + '|' + str(e))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    kind, message = out.stdout.strip().split("|", 1)
    assert kind == "EnvUnavailable" and issubclass(EnvUnavailable, RuntimeError)
    assert "'openai/gsm8k'" in message and "data_path" in message and "\n" not in message


def test_installed_layout_loads_and_a_missing_file_names_the_install_command(tmp_path, tiny):
    rows = [{"problem": "What is 2 + 3?", "answer": "5", "solution": "2 + 3 = 5\n#### 5"}]
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_text(json.dumps(rows[0]) + "\n", encoding="utf-8")
    env = GSM8KEnv(data_path=str(tmp_path / "gsm8k" / "{split}.jsonl"))
    assert env.reset(0) == "What is 2 + 3?" and env.step("5")[3]["success"]
    with pytest.raises(FileNotFoundError) as err:
        GSM8KEnv(data_path=str(tmp_path / "nothere" / "{split}.jsonl"))
    message = str(err.value)
    assert (
        "nothere/train.jsonl" in message
        and "scripts/install_dataset.sh --gsm8k" in message
        and "\n" not in message
    )


@pytest.mark.shared_data("gsm8k/test.jsonl")
def test_every_shared_gold_answer_parses():
    problems = load_problems(str(SHARED_TEST), "test")
    assert len(problems) == 1319
    assert all(p.gold == p.gold.to_integral_value() for p in problems)  # GSM8K golds are whole numbers
