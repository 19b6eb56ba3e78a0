import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

import grl.envs
from grl.envs.sokoban_levels import generate_level, reverse_search, scramble
from grl.envs.solvers import solve_sokoban

LEVEL = """
#######
#     #
# $@. #
#  *  #
#######
"""


def drive(env, actions):
    """Play actions through step(); return the total reward and the last step."""
    total, last = 0.0, None
    for action in actions:
        last = env.step(action)
        total += last[1]
    return total, last


# ------------------------------------------------------- slow reference model


def reference_step(grid, action):
    """Sokoban rules on a list-of-lists grid of rendered symbols; returns (reward, valid, effective)."""
    moves = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    key = action.strip().lower() if isinstance(action, str) else None
    if key not in moves:
        return -0.1, False, False
    dr, dc = moves[key]
    pr, pc = next((r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch in "PS")

    def at(r, c):
        return grid[r][c] if 0 <= r < len(grid) and 0 <= c < len(grid[r]) else "#"

    ahead, beyond = at(pr + dr, pc + dc), at(pr + 2 * dr, pc + 2 * dc)
    reward = -0.1
    if ahead == "#" or (ahead in "X√" and beyond in "#X√"):
        return reward, True, False
    if ahead in "X√":
        reward += (beyond == "O") - (ahead == "√")
        grid[pr + 2 * dr][pc + 2 * dc] = "√" if beyond == "O" else "X"
    grid[pr][pc] = "O" if grid[pr][pc] == "S" else "_"
    grid[pr + dr][pc + dc] = "S" if ahead in "O√" else "P"
    if not any(ch == "X" for row in grid for ch in row):
        reward += 10
    return reward, True, True


def test_matches_reference_model_on_random_actions():
    actions = ["Up", "down", " LEFT ", "Right\n", "right", "left", "up", "jump", "", "Up Up", "4", "DOWN"]
    rng = random.Random(0)
    for seed in range(30):
        env = grl.envs.make("sokoban", dim_room=(7, 7), num_boxes=2, max_steps=60)
        obs = env.reset(seed)
        grid = [list(row) for row in obs.split("\n")]
        for t in range(60):
            action = rng.choice(actions)
            reward, valid, effective = reference_step(grid, action)
            obs, got_reward, done, info = env.step(action)
            solved = not any(ch == "X" for row in grid for ch in row)
            assert obs == "\n".join("".join(row) for row in grid)
            assert got_reward == pytest.approx(reward)
            assert (info["action_is_valid"], info["action_is_effective"], info["success"]) == (
                valid,
                effective,
                solved,
            )
            assert done == (solved or t == 59)
            if done:
                break


# ------------------------------------------------------------- generation


@pytest.mark.parametrize(
    "dim_room,num_boxes,seeds", [((6, 6), 1, 150), ((8, 8), 1, 100), ((7, 7), 2, 40), ((8, 8), 2, 15)]
)
def test_generated_levels_are_solved_by_bfs_through_step(dim_room, num_boxes, seeds):
    env = grl.envs.make("sokoban", dim_room=list(dim_room), num_boxes=num_boxes, max_steps=500)
    for seed in range(seeds):
        obs = env.reset(seed)
        start_on = obs.count("√")
        plan = solve_sokoban(obs)
        assert plan, f"seed {seed}: level unsolvable or already solved\n{obs}"
        total, (obs, reward, done, info) = drive(env, plan)
        assert done and info["success"], f"seed {seed}"
        # +1 per box that ends on a target net of those that started on one
        assert total == pytest.approx(-0.1 * len(plan) + num_boxes - start_on + 10)


def test_optimal_prefix_never_succeeds():
    env = grl.envs.make("sokoban", dim_room=(8, 8), num_boxes=1)
    for seed in range(20):
        plan = solve_sokoban(env.reset(seed))
        env.reset(seed)
        for action in plan[:-1]:
            _, _, done, info = env.step(action)
            assert not done and not info["success"]


def test_generated_level_invariants():
    for seed in range(50):
        level = generate_level(seed, (8, 9), 2, 100)
        assert (level.rows, level.cols) == (8, 9)
        border = {(r, c) for r in range(8) for c in range(9) if r in (0, 7) or c in (0, 8)}
        assert border <= level.walls
        assert len(level.boxes) == len(level.targets) == 2
        assert level.boxes != level.targets and scramble(level) > 0
        assert level.player not in level.walls | level.boxes
        assert not (level.boxes | level.targets) & level.walls


def test_same_seed_same_level_and_seeds_differ():
    a = grl.envs.make("sokoban", dim_room=(8, 8))
    b = grl.envs.make("sokoban", dim_room=(8, 8))
    levels = [a.reset(seed) for seed in range(20)]
    assert levels == [b.reset(seed) for seed in range(20)]
    assert len(set(levels)) >= 18


def test_reverse_search_keeps_the_farthest_box():
    # One corridor row: the target at column 1, the player right of it. Pulls can
    # only carry the box right, and the player needs one cell beyond the box.
    cols = 8
    floor = {cols + c for c in range(1, cols - 1)}
    boxes, reach = reverse_search(floor, cols, frozenset({cols + 1}), cols + 3, search_depth=100)
    assert boxes == {cols + cols - 3}
    assert reach == [cols + cols - 2]
    # search_depth bounds the number of pulls
    boxes, _ = reverse_search(floor, cols, frozenset({cols + 1}), cols + 3, search_depth=2)
    assert boxes == {cols + 3}


# ---------------------------------------------------------- fixed levels


def test_parse_and_render_symbols():
    env = grl.envs.make("sokoban", level=LEVEL)
    assert env.reset(0) == "#######\n#_____#\n#_XPO_#\n#__√__#\n#######"
    assert env.level.player == (2, 3) and env.level.targets == {(2, 4), (3, 3)}
    for symbol in "#_OX√PS":
        assert symbol in env.legend()
    assert all(name in env.action_help() for name in ("Up", "Down", "Left", "Right"))


def test_walls_pushes_and_rewards():
    env = grl.envs.make("sokoban", level=LEVEL)
    start = env.reset(0)
    obs, reward, done, info = env.step("Down")  # the box below has a wall behind it
    assert obs == start and reward == pytest.approx(-0.1)
    assert info["action_is_valid"] and not info["action_is_effective"]
    env.reset(0)
    obs, reward, _, info = env.step("Left")  # push the box onto plain floor
    assert obs.split("\n")[2] == "#XP_O_#" and reward == pytest.approx(-0.1) and info["action_is_effective"]
    env.reset(0)
    _, (obs, reward, done, _) = drive(env, ["Right", "Down", "Left"])  # push the box off its target
    assert obs.split("\n")[3] == "#_XS__#" and reward == pytest.approx(-1.1) and not done
    env.reset(0)
    plan = solve_sokoban(env.render())
    total, (obs, reward, done, info) = drive(env, plan)
    assert done and info["success"] and reward == pytest.approx(-0.1 + 1 + 10)
    assert total == pytest.approx(-0.1 * len(plan) + 11)


def test_box_off_target_costs_one():
    env = grl.envs.make("sokoban", level="#####\n#@*_#\n#_$.#\n#####")
    env.reset(0)
    obs, reward, done, info = env.step("Right")
    assert obs == "#####\n#_SX#\n#_XO#\n#####"  # the player now stands on the target
    assert reward == pytest.approx(-1.1) and info["action_is_effective"] and not done


def test_levels_path_picks_level_by_seed(tmp_path):
    text = "; 0\n#####\n#@$.#\n#####\n\n; 1\n######\n#@_$.#\n######\n\n; 2\n  #####\n  #@$.#\n  #####\n"
    path = tmp_path / "levels.txt"
    path.write_text(text)
    env = grl.envs.make("sokoban", levels_path=str(path))
    assert env.reset(1) == "######\n#P_XO#\n######"
    assert env.reset(4) == env.reset(1)
    # floor outside the outer wall (leading spaces) is shown as wall
    assert env.reset(2) == "#######\n###PXO#\n#######"
    _, reward, done, info = env.step("Right")
    assert done and info["success"] and reward == pytest.approx(10.9)


@pytest.mark.parametrize(
    "bad,needle",
    [
        ("#####\n#$.#\n#####", "player"),
        ("#####\n#@$$.#\n#####", "boxes"),
        ("#####\n#@$.?#\n#####", "'?'"),
        ("#####\n#@*#\n#####", "solved"),
        ("", "empty"),
    ],
)
def test_bad_levels_raise_clear_errors(bad, needle):
    with pytest.raises(ValueError, match="sokoban") as err:
        grl.envs.make("sokoban", level=bad)
    assert needle in str(err.value)


def test_bad_config_raises_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="levels_path"):
        grl.envs.make("sokoban", levels_path=str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="dim_room"):
        grl.envs.make("sokoban", dim_room=(3, 3))
    with pytest.raises(ValueError, match="dim_room"):
        grl.envs.make("sokoban", dim_room="big")
    for key, bad in [
        ("solution_moves", 0),
        ("solution_moves", 2.5),
        ("solution_moves", True),
        ("shaping_weight", -1),
        ("shaping_weight", float("nan")),
        ("shaping_weight", "1"),
        ("shaping_gamma", 0),
        ("shaping_gamma", 1.5),
        ("shaping_player", "yes"),
        ("describe_positions", 1),
    ]:
        with pytest.raises(ValueError, match=f"sokoban: {key} must"):
            grl.envs.make("sokoban", **{key: bad})
    assert grl.envs.config_keys("sokoban") == {
        "dim_room",
        "num_boxes",
        "max_steps",
        "search_depth",
        "solution_moves",
        "level",
        "levels_path",
        "shaping_weight",
        "shaping_player",
        "shaping_gamma",
        "describe_positions",
    }


# ------------------------------------------------------- positions in words

WORDS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def read_offset(text):
    """'2 up and 1 right' -> (-2, 1), one clause at a time."""
    if text == "the same cell":
        return (0, 0)
    dr = dc = 0
    for part in text.split(" and "):
        count, word = part.split()
        dr, dc = dr + int(count) * WORDS[word][0], dc + int(count) * WORDS[word][1]
    return (dr, dc)


def test_described_positions_say_what_the_grid_shows():
    rng = random.Random(0)
    plain = grl.envs.make("sokoban", dim_room=(7, 7), num_boxes=2)
    described = grl.envs.make("sokoban", dim_room=(7, 7), num_boxes=2, describe_positions=True)
    seen_on_target = 0
    for seed in range(12):
        obs, text = plain.reset(seed), described.reset(seed)
        for _ in range(30):
            grid, words = text.split("\n")[:-1], text.split("\n")[-1]
            assert "\n".join(grid) == obs
            cells = {(r, c): ch for r, row in enumerate(grid) for c, ch in enumerate(row)}
            player = next(cell for cell, ch in cells.items() if ch in "PS")
            boxes = sorted(cell for cell, ch in cells.items() if ch in "X√")
            loose = [cell for cell, ch in cells.items() if ch == "X"]
            free_targets = sorted(cell for cell, ch in cells.items() if ch in "OS")
            said = re.fullmatch(
                r"You are at row (\d+), column (\d+)\.((?: Box at [^.]*\.)*)((?: Target at [^.]*\.)*)", words
            )
            assert said, words
            assert (int(said[1]) - 1, int(said[2]) - 1) == player
            said_boxes = re.findall(
                r"Box at row (\d+), column (\d+): (on a target, )?([^.]*) of you\.", said[3]
            )
            assert [(int(r) - 1, int(c) - 1) for r, c, _, _ in said_boxes] == boxes
            for (r, c, on_target, offset), box in zip(said_boxes, boxes):
                assert bool(on_target) == (cells[box] == "√")
                assert read_offset(offset) == (box[0] - player[0], box[1] - player[1])
                seen_on_target += bool(on_target)
            said_targets = re.findall(r"Target at row (\d+), column (\d+): ([^.]*) of the box\.", said[4])
            assert [(int(r) - 1, int(c) - 1) for r, c, _ in said_targets] == free_targets
            for (_, _, offset), target in zip(said_targets, free_targets):
                dr, dc = read_offset(offset)
                nearest = min(abs(b[0] - target[0]) + abs(b[1] - target[1]) for b in loose)
                assert (target[0] - dr, target[1] - dc) in loose
                assert abs(dr) + abs(dc) == nearest
            move = rng.choice(["Up", "Down", "Left", "Right"])
            obs, text = plain.step(move)[0], described.step(move)[0]
    assert seen_on_target  # the walk put a box on a target at least once, so that clause was checked


# --------------------------------------------------------- actions, limits


@pytest.mark.parametrize("action", ["jump", "", "  ", "up up", "U", "north", None, 3, "Up."])
def test_invalid_actions_are_flagged_and_change_nothing(action):
    env = grl.envs.make("sokoban", level=LEVEL)
    before = env.reset(0)
    obs, reward, done, info = env.step(action)
    assert obs == before and reward == pytest.approx(-0.1) and not done
    assert info == {"success": False, "action_is_valid": False, "action_is_effective": False}


def test_max_steps_ends_without_success_and_later_steps_are_inert():
    env = grl.envs.make("sokoban", level=LEVEL, max_steps=3)
    env.reset(0)
    results = [env.step("Up") for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True]
    assert not results[-1][3]["success"]
    obs, reward, done, info = env.step("Down")
    assert obs == results[-1][0] and reward == 0.0 and done and not info["action_is_effective"]


def test_same_seed_same_level_across_processes():
    # Rollout workers are separate processes: a level must not depend on hash randomisation.
    code = (
        "import grl.envs; env = grl.envs.make('sokoban', dim_room=(8, 8), num_boxes=2);"
        "by_moves = grl.envs.make('sokoban', dim_room=(8, 8), num_boxes=2, solution_moves=9);"
        "print('|'.join(e.reset(seed) for e in (env, by_moves) for seed in range(10)))"
    )
    root = str(Path(__file__).resolve().parents[2])
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env={"PYTHONHASHSEED": hash_seed, "PYTHONPATH": root},
        ).stdout
        for hash_seed in ("1", "2")
    }
    env = grl.envs.make("sokoban", dim_room=(8, 8), num_boxes=2)
    by_moves = grl.envs.make("sokoban", dim_room=(8, 8), num_boxes=2, solution_moves=9)
    assert outputs == {"|".join(e.reset(seed) for e in (env, by_moves) for seed in range(10)) + "\n"}


# ---------------------------------------------------------------- shaping


def reference_distance(observation):
    """Box-to-nearest-target plus player-to-nearest-loose-box Manhattan distances, read off the rendered
    grid."""
    cells = {(r, c): ch for r, row in enumerate(observation.split("\n")) for c, ch in enumerate(row)}
    targets = [cell for cell, ch in cells.items() if ch in "OS√"]
    loose = [cell for cell, ch in cells.items() if ch == "X"]
    player = next(cell for cell, ch in cells.items() if ch in "PS")

    def manhattan(a, b):
        return abs(a[0] - b[0]) + abs(a[1] - b[1])

    boxes = sum(min(manhattan(box, t) for t in targets) for box in loose)
    return boxes, min((manhattan(player, box) for box in loose), default=0)


@pytest.mark.parametrize("gamma,with_player", [(1.0, True), (1.0, False), (0.9, True)])
def test_shaping_is_gamma_phi_next_minus_phi_and_telescopes(gamma, with_player):
    weight = 0.5
    rng = random.Random(1)
    for seed in range(15):
        plain = grl.envs.make("sokoban", dim_room=(7, 7), num_boxes=2, max_steps=40)
        shaped = grl.envs.make(
            "sokoban",
            dim_room=(7, 7),
            num_boxes=2,
            max_steps=40,
            shaping_weight=weight,
            shaping_player=with_player,
            shaping_gamma=gamma,
        )

        def phi(observation):
            boxes, player = reference_distance(observation)
            return -weight * (boxes + player * with_player)

        first = obs = plain.reset(seed)
        assert shaped.reset(seed) == obs
        # an optimal plan's moves mixed with random ones, so that episodes both solve and time out
        plan = solve_sokoban(obs) if seed % 2 else []
        discounted, t, done = 0.0, 0, False
        while not done:
            action = plan[t] if t < len(plan) else rng.choice(["Up", "Down", "Left", "Right", "jump"])
            after, reward, done, _ = plain.step(action)
            assert shaped.step(action)[:3] == (
                after,
                pytest.approx(reward + gamma * phi(after) - phi(obs)),
                done,
            )
            discounted += gamma**t * (gamma * phi(after) - phi(obs))
            obs, t = after, t + 1
        assert discounted == pytest.approx(gamma**t * phi(obs) - phi(first))


def test_shaping_earns_nothing_over_a_loop_and_is_off_by_default():
    level = "#######\n#     #\n# @$  #\n#   . #\n#######"
    # push the box right, walk round it, push it back, walk home; bump a wall and send a bad action on the way
    loop = ["Right", "Up", "Up", "Right", "Right", "Down", "Left", "Down", "jump", "Left", "Left", "Up"]
    env = grl.envs.make("sokoban", level=level, shaping_weight=0.5, shaping_player=True)
    plain = grl.envs.make("sokoban", level=level)
    start = env.reset(0)
    plain.reset(0)
    shaping = [env.step(a)[1] - plain.step(a)[1] for a in loop]
    assert env.render() == start
    assert any(abs(term) > 0.1 for term in shaping)
    assert sum(shaping) == pytest.approx(0.0, abs=1e-12)
    # off by default: a box pushed closer to its target earns only the step penalty
    plain.reset(0)
    assert plain.step("Right")[1] == pytest.approx(-0.1)
