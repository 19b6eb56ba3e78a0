import ast
import itertools
import random

import pytest

import grl.envs
from grl.envs.blocksworld import all_states, parse_action
from grl.envs.solvers import solve_blocksworld


def brute_force_states(n):
    """Slow reference: every on-assignment without a cycle and with at most one block on each block."""
    states = []
    for on in itertools.product(range(n + 1), repeat=n):
        if any(on[b - 1] == b for b in range(1, n + 1)):
            continue
        if any(on.count(b) > 1 for b in range(1, n + 1)):
            continue

        def grounded(block, depth=0):
            return on[block - 1] == 0 or (depth < n and grounded(on[block - 1], depth + 1))

        if all(grounded(b) for b in range(1, n + 1)):
            states.append(on)
    return sorted(states)


def state_of(obs):
    """The current and goal lists of a `1d` observation."""
    current, goal = obs.split("\n")
    return tuple(ast.literal_eval(current.split(": ", 1)[1])), tuple(ast.literal_eval(goal.split(": ", 1)[1]))


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_state_enumeration_matches_brute_force(n):
    assert list(all_states(n)) == brute_force_states(n)


def test_state_counts():
    assert [len(all_states(n)) for n in range(2, 8)] == [3, 13, 73, 501, 4051, 37633]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_bfs_plans_solve_every_episode_through_step(n):
    env = grl.envs.make("blocksworld", num_blocks=n, render_mode="1d")
    lengths = set()
    for seed in range(60):
        start, goal = state_of(env.reset(seed))
        assert start != goal and start in all_states(n) and goal in all_states(n)
        plan = solve_blocksworld(start, goal)
        assert len(plan) == env.optimal_plan_length
        lengths.add(len(plan))
        rewards = []
        for i, (block, dest) in enumerate(plan):
            obs, reward, done, info = env.step(f"move {block} to {dest}")
            rewards.append(reward)
            assert info["action_is_valid"] and info["action_is_effective"]
            assert done == info["success"] == (i == len(plan) - 1)
        assert rewards == [-1.0] * (len(plan) - 1) + [10.0]
        assert state_of(obs)[0] == goal
    assert max(lengths) > 1


def test_optimal_plan_length_gold_values():
    env = grl.envs.make("blocksworld", num_blocks=3)
    cases = [
        ((0, 0, 0), (0, 1, 2), 2),  # build the tower 1-2-3
        ((0, 1, 2), (0, 0, 0), 2),  # take it down
        ((0, 1, 2), (2, 3, 0), 3),  # invert it: 3 down, 2 onto 3, 1 onto 2
        ((0, 0, 1), (3, 0, 0), 2),  # 3 off 1, then 1 onto 3
    ]
    for start, goal, expected in cases:
        env.reset(0)
        env.start, env.state, env.goal, env._optimal = start, start, goal, None
        assert env.optimal_plan_length == expected


def test_matches_reference_rules_on_random_actions():
    rng = random.Random(0)
    for seed in range(40):
        n = rng.choice([2, 3, 4])
        env = grl.envs.make("blocksworld", num_blocks=n, render_mode="1d", max_steps=50)
        state, goal = state_of(env.reset(seed))
        for t in range(50):
            block, dest = rng.randint(0, n + 1), rng.randint(0, n + 1)
            action = rng.choice(
                [f"move {block} to {dest}", f"MOVE {block} TO {dest}  ", "move it", "put 1 on 2"]
            )
            obs, reward, done, info = env.step(action)
            if action in ("move it", "put 1 on 2"):
                expect_state, expect_reward, valid = state, -5, False
            else:
                legal = 1 <= block <= n and 0 <= dest <= n and block != dest and block not in state
                legal = legal and (dest == 0 or dest not in state or state[block - 1] == dest)
                expect_state = state[: block - 1] + (dest,) + state[block:] if legal else state
                valid = legal
                expect_reward = (10 if expect_state == goal else -1) if legal else -1
            assert state_of(obs) == (expect_state, goal)
            assert reward == expect_reward and info["action_is_valid"] == valid
            assert info["action_is_effective"] == (expect_state != state)
            assert info["success"] == (expect_state == goal) and done == (expect_state == goal or t == 49)
            state = expect_state
            if done:
                break


def test_optimal_prefix_and_wrong_plans_never_succeed():
    env = grl.envs.make("blocksworld", num_blocks=4, render_mode="1d")
    for seed in range(30):
        start, goal = state_of(env.reset(seed))
        plan = solve_blocksworld(start, goal)
        for block, dest in plan[:-1]:
            _, _, done, info = env.step(f"move {block} to {dest}")
            assert not done and not info["success"]
        # skipping the last move and repeating a harmless no-op never reaches the goal
        block = next(b for b in range(1, 5) if b not in env.state)
        _, reward, done, info = env.step(f"move {block} to {env.state[block - 1]}")
        assert reward == -1 and not info["success"] and not info["action_is_effective"]


def test_same_seed_same_episode():
    a = grl.envs.make("blocksworld", num_blocks=3, render_mode="text")
    b = grl.envs.make("blocksworld", num_blocks=3, render_mode="text")
    episodes = [a.reset(seed) for seed in range(30)]
    assert episodes == [b.reset(seed) for seed in range(30)]
    assert len(set(episodes)) >= 25


def test_render_modes():
    outputs = {}
    for mode in ("text", "1d", "2d_sparse"):
        env = grl.envs.make("blocksworld", num_blocks=3, render_mode=mode)
        env.reset(0)
        env.state, env.goal = (0, 1, 0), (0, 0, 2)
        outputs[mode] = env.render()
    assert outputs["text"] == (
        "Current state: Block 1 is on the table. Block 2 is on top of Block 1. Block 3 is on the table.\n"
        "Goal state: Block 1 is on the table. Block 2 is on the table. Block 3 is on top of Block 2."
    )
    assert outputs["1d"] == "Current state: [0, 1, 0]\nGoal state: [0, 0, 2]"
    assert (
        outputs["2d_sparse"]
        == "Current state:\n[2]\n[1] [3]\n=======\n\nGoal state:\n    [3]\n[1] [2]\n======="
    )


@pytest.mark.parametrize(
    "text,expected",
    [
        ("move 2 to 0", (2, 0)),
        ("  Move 2 To 3 \n", (2, 3)),
        ("(move 1 to 2)", (1, 2)),
        ("[move 3 to table]", (3, 0)),
        ("move block 2 onto block 1.", (2, 1)),
        ("move 2 on the table", (2, 0)),
        ("move 12 to 3", (12, 3)),
        ("move 2", None),
        ("move two to one", None),
        ("move 2 to 3 and 1 to 2", None),
        ("", None),
        (None, None),
        ("(", None),
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_unparseable_and_illegal_actions():
    env = grl.envs.make("blocksworld", num_blocks=3, render_mode="1d", max_steps=3)
    start = env.reset(5)
    obs, reward, done, info = env.step("fly away")
    assert (obs, reward, done) == (start, -5, False) and not info["action_is_valid"]
    obs, reward, done, info = env.step("move 9 to 0")
    assert (obs, reward, done) == (start, -1, False) and not info["action_is_valid"]
    obs, reward, done, info = env.step("move 1 to 1")
    assert (obs, reward, done) == (start, -1, True) and not info["success"]  # max_steps reached
    assert env.step("move 1 to 0")[1:3] == (0.0, True)


def test_covered_block_cannot_move():
    env = grl.envs.make("blocksworld", num_blocks=3, render_mode="1d")
    env.reset(0)
    env.state, env.goal = (0, 1, 0), (0, 0, 0)
    for action in ("move 1 to 3", "move 3 to 1", "move 3 to 3"):
        _, reward, _, info = env.step(action)
        assert reward == -1 and not info["action_is_valid"] and env.state == (0, 1, 0)


def test_help_and_bad_config():
    env = grl.envs.make("blocksworld")
    assert "move X to Y" in env.action_help()
    assert "0" in grl.envs.make("blocksworld", render_mode="1d").legend()
    with pytest.raises(ValueError, match="render_mode"):
        grl.envs.make("blocksworld", render_mode="3d")
    with pytest.raises(ValueError, match="num_blocks"):
        grl.envs.make("blocksworld", num_blocks=9)
    assert grl.envs.config_keys("blocksworld") == {"num_blocks", "render_mode", "max_steps"}
