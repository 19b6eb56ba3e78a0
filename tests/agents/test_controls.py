"""The observation-swap control and the input-dependence measures, on scripted policies.

A policy that ignores the board scores the same whether it is shown its own game or a decoy; a
policy that reads the board (a BFS solver's next move for what it is shown) wins its own games and
loses most decoy-driven ones. The mutual-information proxy tells the same two policies apart.
"""

import math

import pytest
from agent_text import state_of

from grl.agents import make_agent
from grl.agents.controls import SwappedAgent, decoy_seed, make_swapped_agent
from grl.envs.solvers import solve_sokoban
from grl.rollout.diagnostics import input_dependence_metrics, mutual_information
from grl.rollout.types import Episode, Turn

SEEDS = range(12)


def constant_policy(shown_state: str) -> str:
    return "Up"


def solver_policy(shown_state: str) -> str:
    plan = solve_sokoban(shown_state, max_states=200_000)
    return plan[0] if plan else "Up"


def reply(action: str) -> str:
    return f"<think>scripted</think><answer>{action}</answer>"


def play(agent, seed: int, policy) -> tuple[float, list[Turn]]:
    """One episode; the policy sees only the last user message, as the model would."""
    messages = agent.reset(seed)
    turns, done = [], False
    while not done:
        shown = state_of(messages[-1]["content"])
        action = policy(shown)
        result = agent.step(reply(action))
        turns.append(Turn([], [], None, result.reward, info={"answer": action}, state_key=shown))
        messages, done = agent.messages, result.done
    return agent.episode_metrics()["success"], turns


# One move a turn and enough turns for any 6x6 puzzle the generator makes.
ONE_MOVE_TURNS = {"max_turns": 30, "max_actions_per_turn": 1, "max_actions_all_turns": 30}


@pytest.fixture
def sokoban(task):
    return task("simpleSokobanAgent", agent=ONE_MOVE_TURNS)


def success_rate(make, policy) -> float:
    agent = make()
    wins = [play(agent, seed, policy)[0] for seed in SEEDS]
    agent.close()
    return sum(wins) / len(wins)


def test_swapped_agent_shows_the_decoy_and_plays_the_real_game(sokoban):
    real = make_agent("simpleSokobanAgent", sokoban)
    decoy = make_agent("simpleSokobanAgent", sokoban)
    swapped = SwappedAgent(
        make_agent("simpleSokobanAgent", sokoban), make_agent("simpleSokobanAgent", sokoban)
    )
    shown = swapped.reset(3)
    assert shown == decoy.reset(decoy_seed(3)) and shown != real.reset(3)
    for action in ["Up", "Left", "Down"]:
        got, want = swapped.step(reply(action)), real.step(reply(action))
        assert (got.reward, got.done) == (want.reward, want.done)
        decoy.step(reply(action))
        assert swapped.messages[-1] == decoy.messages[-1]
    assert swapped.episode_metrics() == real.episode_metrics()


def test_a_state_independent_policy_scores_the_same_in_both_arms(sokoban):
    true_arm = success_rate(lambda: make_agent("simpleSokobanAgent", sokoban), constant_policy)
    swapped_arm = success_rate(lambda: make_swapped_agent("simpleSokobanAgent", sokoban), constant_policy)
    assert true_arm == swapped_arm


def test_a_board_reading_policy_scores_higher_in_the_true_arm(sokoban):
    true_arm = success_rate(lambda: make_agent("simpleSokobanAgent", sokoban), solver_policy)
    swapped_arm = success_rate(lambda: make_swapped_agent("simpleSokobanAgent", sokoban), solver_policy)
    assert true_arm == 1.0
    assert swapped_arm <= true_arm - 0.5


@pytest.mark.parametrize("moves", [1, 4])
def test_a_finished_decoy_shows_its_final_board_at_the_real_turn(task, moves):
    # `moves`: the decoy is solved in that many moves; after one move its only message was the first,
    # instructions and all
    swapped = make_swapped_agent(
        "simpleSokobanAgent", task("simpleSokobanAgent", agent=ONE_MOVE_TURNS, env={"solution_moves": moves})
    )
    messages = swapped.reset(0)
    for action in solve_sokoban(state_of(messages[-1]["content"])):  # solves the decoy, not the real game
        result = swapped.step(reply(action))
    assert swapped.decoy.episode_metrics()["success"] == 1.0 and not result.done
    final_board = swapped.decoy.observation
    assert "√" in final_board and "X" not in final_board
    for turn in range(moves + 1, moves + 4):
        shown = swapped.messages[-1]["content"]
        assert state_of(shown) == final_board
        assert f"Turn {turn}. State:" in shown and "Solve the Sokoban puzzle" not in shown
        assert swapped.messages[-2]["role"] == "assistant"
        swapped.step(reply("Wait"))  # no move, so the real game (also this close to solved) goes on


def episodes_of(policy, make, task_name="simpleSokobanAgent"):
    agent = make()
    episodes = []
    for seed in SEEDS:
        _, turns = play(agent, seed, policy)
        episodes.append(Episode(task_name, seed, seed, turns, sum(t.reward for t in turns)))
    return episodes


def test_mutual_information_of_a_constant_policy_is_zero_and_of_the_solver_positive(sokoban):
    make = lambda: make_agent("simpleSokobanAgent", sokoban)  # noqa: E731
    constant = input_dependence_metrics(episodes_of(constant_policy, make))
    solver = input_dependence_metrics(episodes_of(solver_policy, make))
    assert constant["simpleSokobanAgent/input_mi"] == 0.0
    assert constant["simpleSokobanAgent/answer_cond_entropy"] == 0.0
    assert solver["simpleSokobanAgent/input_mi"] > 0.5  # nats; four moves give at most log 4 = 1.39
    assert solver["simpleSokobanAgent/input_mi_norm"] > 0.9  # the solver's move is a function of the board


def test_mutual_information_matches_a_hand_computed_table():
    # X uniform over {a, b}; Z = X half of the time, else the other letter: I = log 2 - H(1/2) = 0.
    assert mutual_information([("a", "a"), ("a", "b"), ("b", "a"), ("b", "b")]) == pytest.approx(
        (0, 0.6931, 0.6931), abs=1e-4
    )
    # Z a function of X with two values: I = H(Z) = log 2, nothing left given X.
    assert mutual_information([("a", 1), ("b", 2), ("a", 1), ("b", 2)]) == pytest.approx(
        (0.6931, 0, 0.6931), abs=1e-4
    )
    # Three states, two map to the same answer: H(Z) = H(2/3, 1/3).
    h = -(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3)
    assert mutual_information([("a", 1), ("b", 1), ("c", 2)]) == pytest.approx((h, 0, h))
    assert mutual_information([]) == (0.0, 0.0, 0.0)
