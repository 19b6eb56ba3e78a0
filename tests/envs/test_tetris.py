import random

import pytest

import grl.envs
from grl.envs.tetris import PIECES

SHAPES = {frozenset(cells) for cells in PIECES.values()}


def parse(obs):
    grid = obs.split("\n")
    filled = {(r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == "#"}
    piece = [(r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == "X"]
    return len(grid), len(grid[0]), filled, piece


def drop(height, width, filled, cells):
    """Slow reference: move cells down one row at a time until blocked; return the locked board."""

    def fits(cs):
        return all(0 <= r < height and 0 <= c < width and (r, c) not in filled for r, c in cs)

    while fits([(r + 1, c) for r, c in cells]):
        cells = [(r + 1, c) for r, c in cells]
    return filled | set(cells)


def full_rows(height, width, filled):
    return [r for r in range(height) if all((r, c) in filled for c in range(width))]


def placement_policy(obs):
    """Left/Right moves then Down to the reachable column that clears a row, else leaves the fewest
    holes, then the flattest and lowest stack."""
    height, width, filled, piece = parse(obs)

    def fits(cs):
        return all(0 <= r < height and 0 <= c < width and (r, c) not in filled for r, c in cs)

    def shifted(k):
        return [(r, c + k) for r, c in piece]

    reachable = [0]
    for step in (-1, 1):
        k = step
        while fits(shifted(k)):
            reachable.append(k)
            k += step

    def score(k):
        board = drop(height, width, filled, shifted(k))
        tops = {c: min((r for r, cc in board if cc == c), default=height) for c in range(width)}
        holes = sum(1 for c in range(width) for r in range(tops[c], height) if (r, c) not in board)
        heights = [height - tops[c] for c in range(width)]
        bumpiness = sum(abs(a - b) for a, b in zip(heights, heights[1:]))
        return (len(full_rows(height, width, board)), -holes, -bumpiness, -max(heights), -abs(k))

    best = max(reachable, key=score)
    return ["Right" if best > 0 else "Left"] * abs(best) + ["Down"]


def play(env, seed, max_pieces=100):
    """Run the placement policy from reset to the end; return the last info and the rewards."""
    obs = env.reset(seed)
    rewards, info, done = [], None, False
    for _ in range(max_pieces):
        for action in placement_policy(obs):
            obs, reward, done, info = env.step(action)
            rewards.append(reward)
        if done:
            break
    return obs, info, rewards


@pytest.mark.parametrize(
    "box_type,dim,min_rate",
    [(1, 4, 1.0), (2, 3, 0.9), (2, 4, 0.95), (3, 4, 0.85)],
)
def test_placement_policy_clears_a_line_through_step(box_type, dim, min_rate):
    env = grl.envs.make("tetris", dim_x=dim, dim_y=dim, box_type=box_type, max_steps=1000)
    wins = 0
    for seed in range(100):
        obs, info, rewards = play(env, seed)
        if info["success"]:
            wins += 1
            lines = (rewards[-1] + 0.1) / 10  # one drop may clear two rows
            assert lines == pytest.approx(round(lines)) and round(lines) >= 1
            assert all(r == pytest.approx(-0.1) for r in rewards[:-1])
        else:
            # the game ended because the next piece had no room: no falling piece is shown
            assert "X" not in obs and all(r == pytest.approx(-0.1) for r in rewards)
    print(f"box_type {box_type} dim {dim}: {wins}/100")
    assert wins >= min_rate * 100, f"{wins}/100 successes"


def test_matches_reference_model_on_random_actions():
    """Every step agrees with a slow model of the rules; new pieces are allowed shapes in the top row."""
    rng = random.Random(1)
    actions = ["Left", "right", " DOWN ", "Down", "left\n", "Right", "drop", "", "Up"]
    for seed in range(40):
        box_type, dim = rng.choice([(1, 4), (2, 3), (2, 4), (3, 4), (3, 5)])
        env = grl.envs.make("tetris", dim_x=dim, dim_y=dim + 1, box_type=box_type, max_steps=200)
        obs = env.reset(seed)
        for t in range(200):
            height, width, filled, piece = parse(obs)
            action = rng.choice(actions)
            key = action.strip().lower()
            obs, reward, done, info = env.step(action)
            new_height, new_width, new_filled, new_piece = parse(obs)
            assert (new_height, new_width) == (height, width)
            assert info["action_is_valid"] == (key in ("left", "right", "down"))
            if key in ("left", "right"):
                moved = [(r, c + (1 if key == "right" else -1)) for r, c in piece]
                can = all(0 <= c < width and (r, c) not in filled for r, c in moved)
                assert new_filled == filled and sorted(new_piece) == sorted(moved if can else piece)
                assert info["action_is_effective"] == can and reward == pytest.approx(-0.1)
            elif key == "down":
                board = drop(height, width, filled, piece)
                rows = full_rows(height, width, board)
                assert info["action_is_effective"] and info["success"] == bool(rows)
                assert reward == pytest.approx(-0.1 + 10 * len(rows))
                if rows:  # cleared rows vanish and the rows above fall
                    kept = [r for r in range(height) if r not in rows]
                    expect = {(height - len(kept) + kept.index(r), c) for r, c in board if r not in rows}
                    assert done and new_filled == expect and not new_piece
                else:
                    assert new_filled == board
                    if new_piece:
                        top = min(r for r, _ in new_piece)
                        left = min(c for _, c in new_piece)
                        assert top == 0 and frozenset((r, c - left) for r, c in new_piece) in SHAPES
                    else:
                        assert done  # game over: the next piece did not fit
            else:
                assert (new_filled, sorted(new_piece)) == (filled, sorted(piece))
                assert reward == pytest.approx(-0.1) and not info["action_is_effective"]
            if done:
                assert info["success"] or not new_piece or t == 199
                break


def test_same_seed_same_pieces():
    runs = []
    for _ in range(2):
        env = grl.envs.make("tetris", dim_x=4, dim_y=4, box_type=3)
        obs = [env.reset(7)] + [env.step(a)[0] for a in ["Down", "Left", "Down", "Right", "Down"]]
        runs.append(obs)
    assert runs[0] == runs[1]
    env = grl.envs.make("tetris", dim_x=5, dim_y=5, box_type=3)
    sequences = {
        tuple(env.reset(seed) if i == 0 else env.step("Down")[0] for i in range(4)) for seed in range(30)
    }
    assert len(sequences) >= 20


def test_box_types_draw_their_pieces_only():
    for box_type, expected in [(1, {"block"}), (2, {"block", "vertical", "horizontal"}), (3, set(PIECES))]:
        env = grl.envs.make("tetris", dim_x=4, dim_y=4, box_type=box_type)
        seen = set()
        for seed in range(60):
            env.reset(seed)
            seen.add(env.piece)
        assert seen == expected


def test_render_and_help():
    env = grl.envs.make("tetris", dim_x=4, dim_y=3, box_type=1)
    obs = env.reset(0)
    rows = obs.split("\n")
    assert len(rows) == 3 and all(len(row) == 4 for row in rows)
    assert rows[0].count("X") == 1 and set(rows[0]) <= {"X", "_"} and rows[1:] == ["____", "____"]
    obs, reward, done, info = env.step("Down")
    assert obs.split("\n")[2].count("#") == 1 and reward == pytest.approx(-0.1) and not done
    for symbol in "_#X":
        assert symbol in env.legend()
    assert all(word in env.action_help() for word in ("Left", "Right", "Down"))


def test_locked_pieces_stay_at_game_over():
    # Dropping every piece where it enters soon leaves no room on a 3x3 board.
    env = grl.envs.make("tetris", dim_x=3, dim_y=3, box_type=3)
    game_overs = 0
    for seed in range(40):
        obs, done, locked = env.reset(seed), False, 0
        while not done:
            locked += obs.count("X")
            obs, _, done, info = env.step("Down")
        if not info["success"]:
            game_overs += 1
            assert "X" not in obs and obs.count("#") == locked
    assert game_overs > 0


def test_invalid_actions_and_max_steps():
    env = grl.envs.make("tetris", dim_x=3, dim_y=3, box_type=2, max_steps=4)
    start = env.reset(3)
    for t, action in enumerate(["rotate", None, "  ", "Left Left"]):
        obs, reward, done, info = env.step(action)
        assert obs == start and reward == pytest.approx(-0.1) and done == (t == 3)
        assert info == {"success": False, "action_is_valid": False, "action_is_effective": False}
    assert env.step("Down") == (
        start,
        0.0,
        True,
        {"success": False, "action_is_valid": True, "action_is_effective": False},
    )


def test_bad_config_raises_clear_errors():
    with pytest.raises(ValueError, match="box_type"):
        grl.envs.make("tetris", box_type=4)
    with pytest.raises(ValueError, match="dim_x"):
        grl.envs.make("tetris", dim_x=1)
    assert grl.envs.config_keys("tetris") == {
        "dim_x",
        "dim_y",
        "box_type",
        "max_steps",
        "gap_rows",
        "max_pieces",
        "coordinates",
        "relative_positions",
        "step_reward",
        "spawn_over_gap",
    }


def grid_of(obs):
    """The board lines of an observation (a `coordinates` observation adds one line of words)."""
    return "\n".join(line for line in obs.split("\n") if line and set(line) <= set("_#X"))


def gap_env(**kw):
    return grl.envs.make(
        "tetris", dim_x=4, dim_y=3, box_type=1, max_steps=5, gap_rows=1, max_pieces=1, coordinates=True, **kw
    )


def test_gap_board_defeats_dropping_at_once_and_rewards_reading():
    """One gap, one piece: dropping where the piece appears wins exactly when it appears over the gap
    (about 1 game in 4); the placement policy, which reads the grid, wins every game."""
    env = gap_env()
    drops_at_once, read_wins, gaps = 0, 0, set()
    for seed in range(200):
        height, width, filled, piece = parse(grid_of(env.reset(seed)))
        bottom_gap = [c for c in range(width) if (height - 1, c) not in filled]
        assert len(bottom_gap) == 1 and len(filled) == width - 1 and len(piece) == 1
        gaps.add(bottom_gap[0])
        over_gap = piece[0][1] == bottom_gap[0]
        obs, reward, done, info = env.step("Down")
        assert done and info["success"] == over_gap  # one piece: the episode ends at the first drop
        assert reward == pytest.approx(9.9 if over_gap else -0.1)
        drops_at_once += over_gap
        read_wins += play(env, seed, max_pieces=1)[1]["success"]
    assert gaps == {0, 1, 2, 3} and 30 <= drops_at_once <= 70 and read_wins == 200


def test_coordinates_line_names_what_the_grid_shows():
    env = gap_env()
    for seed in range(50):
        obs = env.reset(seed)
        for action in ["Left", "Right", "Right", "Down"]:
            height, width, filled, piece = parse(grid_of(obs))
            words = obs.split("\n")[-1]
            assert obs.split("\n")[:height] == grid_of(obs).split("\n")
            if piece:
                assert f"The falling piece is in column {piece[0][1] + 1}." in words
            else:
                assert words.startswith("No piece is falling.")
            open_row = max(r for r in range(height) if not all((r, c) in filled for c in range(width)))
            empty = [str(c + 1) for c in range(width) if (open_row, c) not in filled]
            assert words.endswith(("column " if len(empty) == 1 else "columns ") + ", ".join(empty) + ".")
            obs, _, done, _ = env.step(action)
            if done:
                break


def test_relative_line_points_from_the_piece_to_the_gap_the_grid_shows():
    """Read back against the grid: the words name the side and the distance of the nearest empty cell of
    the lowest open row, and a player that does only what the words say wins every game."""
    env = gap_env(relative_positions=True)
    for seed in range(100):
        obs, done = env.reset(seed), False
        while not done:
            height, width, filled, piece = parse(grid_of(obs))
            words = obs.split("\n")[-1]
            open_row = max(r for r in range(height) if not all((r, c) in filled for c in range(width)))
            offset = min(
                (c - piece[0][1] for c in range(width) if (open_row, c) not in filled),
                key=lambda d: (abs(d), d),
            )
            side = "right" if offset > 0 else "left"
            expected = (
                "The piece is right above the gap."
                if offset == 0
                else f"The gap is {abs(offset)} column{'s' if abs(offset) > 1 else ''} {side} of the piece."
            )
            assert words == expected
            action = "Down" if offset == 0 else side.capitalize()
            obs, _, done, info = env.step(action)
        assert info["success"]


def test_gap_rows_and_max_pieces_in_a_longer_game():
    env = grl.envs.make("tetris", dim_x=4, dim_y=5, box_type=1, gap_rows=2, max_pieces=3)
    for seed in range(30):
        height, width, filled, piece = parse(env.reset(seed))
        assert all(sum((r, c) in filled for c in range(width)) == width - 1 for r in (3, 4))
        assert not any(r < 3 for r, _ in filled)
        for locked in range(1, 4):
            obs, _, done, info = env.step("Down")
            if info["success"]:
                break
            assert done == (locked == 3)
        assert done


@pytest.mark.parametrize(
    "key,value",
    [
        ("gap_rows", 2),
        ("gap_rows", -1),
        ("gap_rows", 1.5),
        ("max_pieces", -2),
        ("max_pieces", True),
        ("coordinates", "yes"),
        ("relative_positions", 1),
        ("step_reward", 0.5),
        ("step_reward", "0"),
        ("step_reward", float("nan")),
        ("spawn_over_gap", 0),
    ],
)
def test_gap_keys_refused_with_their_name(key, value):
    with pytest.raises(ValueError, match=key):
        grl.envs.make("tetris", **{"dim_x": 4, "dim_y": 3, key: value})


def test_step_reward_zero_leaves_success_alone():
    env = gap_env(step_reward=0)
    for seed in range(20):
        env.reset(seed)
        rewards = [env.step(a)[1] for a in ("Left", "Right", "Down")]
        assert rewards[:2] == [0.0, 0.0] and rewards[2] in (0.0, 10.0)


def test_pieces_off_the_gap_defeat_every_fixed_sequence():
    """With `spawn_over_gap: false` no game is won without moving; the best fixed sequence of moves
    (one step towards a side, then Down) wins about 1 game in 4; the placement policy wins all."""
    env = gap_env(step_reward=0, spawn_over_gap=False)
    sequences = [[move] * k + ["Down"] for move in ("Left", "Right") for k in range(4)]
    wins = dict.fromkeys(map(tuple, sequences), 0)
    for seed in range(400):
        height, width, filled, piece = parse(grid_of(env.reset(seed)))
        assert (height - 1, piece[0][1]) in filled  # never over the gap
        for sequence in sequences:
            env.reset(seed)
            wins[tuple(sequence)] += [env.step(a) for a in sequence][-1][3]["success"]
        assert play(env, seed, max_pieces=1)[1]["success"]
    assert wins[("Down",)] == 0 and max(wins.values()) <= 0.32 * 400
