"""Each env driven to success through the agent's text interface by a scripted player.

The players read only what the model reads (the state in the last user
message) and answer only as the model would (a reply string).
"""

import ast
import copy
import json
import re

import pytest

import grl.envs
from grl.agents import make_agent
from grl.envs.gsm8k import extract_answer

from agent_text import GSM8K_TEST, SHARED_DATA, state_of


def think_answer(actions):
    return f"<think>scripted</think><answer>{' || '.join(actions)}</answer>"


def play(agent, seed, policy):
    """Run an episode where `policy(state_text)` picks each reply's actions."""
    agent.reset(seed)
    done, total = False, 0.0
    while not done:
        result = agent.step(think_answer(policy(state_of(agent.messages[-1]["content"]))))
        total, done = total + result.reward, result.done
    return total, agent.episode_metrics()


# ---------------------------------------------------------------- Sokoban


@pytest.mark.parametrize("name", ["simpleSokobanAgent", "largeSokobanAgent"])
def test_sokoban_bfs_solves_through_the_agent(task, name):
    from grl.envs.solvers import solve_sokoban

    # A larger budget than the task's, so that every seed is solvable; the BFS
    # re-plans from the shown state each turn.
    agent = make_agent(name, task(name, agent={"max_turns": 20, "max_actions_all_turns": 100}))
    per_turn = agent.settings.max_actions_per_turn
    for seed in range(8):
        total, metrics = play(agent, seed, lambda state: solve_sokoban(state)[:per_turn])
        assert metrics["success"] == 1.0 and metrics["action_is_valid"] == 1.0 and metrics["format_ok"] == 1.0
        assert total > 0


def test_sokoban_short_puzzles_fit_the_task_budget(task):
    """With simpleSokobanAgent's own budget, a puzzle BFS solves in <= 10 moves is won."""
    from grl.envs.solvers import solve_sokoban

    agent = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
    won = 0
    for seed in range(20):
        plan = solve_sokoban(grl.envs.make("sokoban", dim_room=[6, 6], num_boxes=1).reset(seed))
        if len(plan) <= 10:
            total, metrics = play(agent, seed, lambda state: solve_sokoban(state)[:5])
            assert metrics["success"] == 1.0 and metrics["num_actions"] == len(plan)
            won += 1
    assert won > 0


# ---------------------------------------------------------------- Tetris


def tetris_policy(state: str) -> list[str]:
    """Greedy placement: try every column for the falling piece, drop it in a
    plain simulation of the shown board, and prefer cleared rows, then fewer
    covered holes, then cells placed as deep as possible."""
    rows = state.split("\n")
    piece = [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "X"]
    filled = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "#"}
    height, width = len(rows), len(rows[0])
    left = min(c for _, c in piece)

    def fits(cells):
        return all(0 <= r < height and 0 <= c < width and (r, c) not in filled for r, c in cells)

    best = None
    for shift in range(-left, width):
        cells = [(r, c + shift) for r, c in piece]
        if not fits(cells):
            continue
        while fits([(r + 1, c) for r, c in cells]):
            cells = [(r + 1, c) for r, c in cells]
        board = filled | set(cells)
        cleared = sum(all((r, c) in board for c in range(width)) for r in range(height))
        holes = sum(
            (r, c) not in board and any((above, c) in board for above in range(r))
            for r in range(height)
            for c in range(width)
        )
        score = (cleared, -holes, sum(r for r, _ in cells), -abs(shift))
        if best is None or score > best[0]:
            best = (score, shift)
    shift = best[1]
    return ["Right" if shift > 0 else "Left"] * abs(shift) + ["Down"]


@pytest.mark.parametrize(
    "name", ["tetrisAgent_type_1_dim_4", "tetrisAgent_type_2_dim_3", "tetrisAgent_type_2_dim_4"]
)
def test_tetris_placement_policy_clears_a_row(task, name):
    agent = make_agent(name, task(name))
    wins = 0
    for seed in range(20):
        total, metrics = play(agent, seed, tetris_policy)
        assert metrics["action_is_valid"] == 1.0 and metrics["format_ok"] == 1.0
        assert (total > 0) == (metrics["success"] == 1.0)
        wins += metrics["success"] == 1.0
    # Single blocks always fill a row; with two-cell pieces a greedy player can
    # be dealt an unwinnable sequence (e.g. a vertical, then a horizontal on 3x3).
    assert wins == 20 if name.endswith("type_1_dim_4") else wins >= 18


# ---------------------------------------------------------------- GSM8K


@pytest.mark.shared_data("gsm8k/test.jsonl")
def test_gsm8k_all_gold_answers_succeed_and_wrong_ones_never(task):
    rows = [json.loads(line) for line in GSM8K_TEST.read_text(encoding="utf-8").splitlines() if line.strip()]
    block = task("gsm8kAgent_single_turn", env={"data_path": str(GSM8K_TEST), "split": "test"})
    agent = make_agent("gsm8kAgent_single_turn", block)
    assert len(rows) == 1319
    for seed, row in enumerate(rows):
        gold = row["answer"].rsplit("####", 1)[1].strip()  # as written, e.g. "1,600"
        assert state_of(agent.reset(seed)[-1]["content"]) == row["question"].strip()
        right = agent.step(f"<answer>{gold}</answer>")
        assert (right.reward, right.done, right.info["success"]) == (10.0, True, True), gold
        agent.reset(seed)
        wrong = agent.step(f"<answer>{extract_answer(gold) + 1}</answer>")
        assert (wrong.reward, wrong.done, wrong.info["success"]) == (-0.1, True, False), gold
        assert agent.episode_metrics()["success"] == 0.0


@pytest.mark.shared_data("gsm8k/test.jsonl")
def test_gsm8k_five_turns_sum_the_rewards(task):
    block = task("gsm8kAgent_5_turn", env={"data_path": str(GSM8K_TEST), "split": "test"})
    agent = make_agent("gsm8kAgent_5_turn", block)
    messages = agent.reset(0)  # Janet's ducks: 18
    assert "Attempts left: 5." in messages[-1]["content"]
    replies = ["Sixteen minus seven", "<answer>$20</answer>", "so it is 18 dollars", "<answer>18</answer>"]
    results = [agent.step(r) for r in replies[:3]]
    # turn 1: no number (invalid, penalised); turn 2: wrong; turn 3: untagged, judged by its last number
    assert [r.reward for r in results] == pytest.approx([-0.1 - 0.1, -0.1, 10.0 - 0.1])
    assert [r.done for r in results] == [False, False, True]
    feedback = agent.messages[5]["content"]
    assert "is not the right answer" in feedback and "Attempts left: 3." in feedback
    metrics = agent.episode_metrics()
    assert (
        metrics["success"] == 1.0
        and metrics["num_actions"] == 3
        and metrics["format_ok"] == pytest.approx(1 / 3)
    )
    assert metrics["action_is_valid"] == pytest.approx(2 / 3)


@pytest.mark.shared_data("gsm8k/test.jsonl")
def test_gsm8k_answer_is_one_action_whatever_the_separator(task):
    block = task(
        "gsm8kAgent_5_turn",
        agent={"action_separator": ","},
        env={"data_path": str(GSM8K_TEST), "split": "test"},
    )
    agent = make_agent("gsm8kAgent_5_turn", block)
    agent.reset(7)
    gold = (
        json.loads(GSM8K_TEST.read_text(encoding="utf-8").splitlines()[7])["answer"]
        .rsplit("####", 1)[1]
        .strip()
    )
    result = agent.step(f"<answer>{gold}, I think</answer>")
    assert result.info["actions"] == [f"{gold}, I think"]


# ---------------------------------------------------------------- BlocksWorld


def blocks_from_text(part: str) -> tuple[int, ...]:
    below = {int(b): 0 for b in re.findall(r"Block (\d+) is on the table", part)}
    below.update({int(b): int(u) for b, u in re.findall(r"Block (\d+) is on top of Block (\d+)", part)})
    return tuple(below[b] for b in sorted(below))


def blocks_from_drawing(lines: list[str]) -> tuple[int, ...]:
    """Stacks drawn as `[n]` cells, one column every 4 characters, the table line last."""
    below: dict[int, int] = {}
    rows = [line for line in lines if "[" in line]
    for upper, lower in zip(rows, rows[1:] + [""], strict=True):
        for match in re.finditer(r"\[(\d+)\]", upper):
            under = re.match(r"\[(\d+)\]", lower[match.start() : match.end()])
            below[int(match.group(1))] = int(under.group(1)) if under else 0
    return tuple(below[b] for b in sorted(below))


def blocksworld_states(state: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    current, goal = state.split("Goal state:")
    current = current.split("Current state:")[1]
    if re.fullmatch(r"\s*\[[\d,\s]*\]\s*", current):  # 1d: a Python list
        return tuple(ast.literal_eval(current.strip())), tuple(ast.literal_eval(goal.strip()))
    if "Block" in current:
        return blocks_from_text(current), blocks_from_text(goal)
    return blocks_from_drawing(current.split("\n")), blocks_from_drawing(goal.split("\n"))


@pytest.mark.parametrize(
    "name", ["blocksworldAgent_text", "blocksworldAgent_1d", "blocksworldAgent_2d_sparse"]
)
def test_blocksworld_bfs_solves_through_the_agent(task, name):
    from grl.envs.solvers import solve_blocksworld

    agent = make_agent(name, task(name))
    per_turn = agent.settings.max_actions_per_turn

    def policy(state):
        plan = solve_blocksworld(*blocksworld_states(state))
        return [f"move {block} to {dest}" for block, dest in plan[:per_turn]]

    for seed in range(15):
        agent.reset(seed)
        optimal = agent.env.optimal_plan_length
        total, metrics = play(agent, seed, policy)
        assert metrics["success"] == 1.0 and metrics["action_is_valid"] == 1.0 and metrics["format_ok"] == 1.0
        assert metrics["num_actions"] == optimal and total == pytest.approx(10 - (optimal - 1))


# ---------------------------------------------------------------- WebShop (env by another engineer)

WEBSHOP = SHARED_DATA / "webshop"


@pytest.mark.slow
@pytest.mark.shared_data("webshop/products_1k.jsonl", "webshop/items_ins_v2_1000.json")
def test_webshop_shopper_buys_and_the_purchase_rate_counts_it(agents_yaml):
    """A scripted shopper: search the instruction, open the first result, buy it."""
    block = copy.deepcopy(agents_yaml["webshopAgent"])
    block["env_config"].update(
        products_path=str(WEBSHOP / "products_1k.jsonl"), goals_path=str(WEBSHOP / "items_ins_v2_1000.json")
    )
    agent = make_agent("webshopAgent", block)
    instruction = state_of(agent.reset(0)[-1]["content"]).split("\n")[0].removeprefix("Instruction:").strip()
    result = agent.step(think_answer([f"search[{instruction}]"]))
    assert agent.episode_metrics()["purchased"] == 0.0 and not result.done
    first_item = re.search(r"click\[(b0\w+)\]", agent.messages[-1]["content"]).group(1)
    result = agent.step(think_answer([f"click[{first_item}]", "click[buy now]"]))
    metrics = agent.episode_metrics()
    assert result.done and result.info["env_done"] and metrics["purchased"] == 1.0
    assert metrics["num_actions"] == 3 and metrics["action_is_valid"] == 1.0
