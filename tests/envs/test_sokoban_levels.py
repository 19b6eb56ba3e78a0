"""Levels by solution length (`solution_moves`) against a plain forward BFS written here."""

import itertools
from collections import deque

import pytest

import grl.envs
from grl.envs.sokoban import render
from grl.envs.sokoban_levels import Level, generate_level_by_moves, solution_layers

MOVES = [(-1, 0), (1, 0), (0, -1), (0, 1)]


def optimal_moves(level, boxes=None, player=None):
    """Fewest moves that put every box on a target (walking counts), by forward BFS over (player, boxes); None
    if never."""
    start = (level.player if player is None else player, frozenset(level.boxes if boxes is None else boxes))
    depth, frontier = {start: 0}, deque([start])
    while frontier:
        state = frontier.popleft()
        (pr, pc), bxs = state
        if bxs == level.targets:
            return depth[state]
        for dr, dc in MOVES:
            ahead, beyond = (pr + dr, pc + dc), (pr + 2 * dr, pc + 2 * dc)
            if ahead in level.walls or (ahead in bxs and (beyond in level.walls or beyond in bxs)):
                continue
            nxt = (ahead, bxs - {ahead} | {beyond} if ahead in bxs else bxs)
            if nxt not in depth:
                depth[nxt] = depth[state] + 1
                frontier.append(nxt)
    return None


def every_state_distance(level):
    """Optimal move count of every (player, boxes) arrangement of the level's room that can be solved."""
    floor = [(r, c) for r in range(level.rows) for c in range(level.cols) if (r, c) not in level.walls]
    distances = {}
    for boxes in itertools.combinations(floor, len(level.boxes)):
        for player in floor:
            if player not in boxes:
                moves = optimal_moves(level, boxes, player)
                if moves is not None:
                    distances[(player, frozenset(boxes))] = moves
    return distances


@pytest.mark.parametrize("dim_room,num_boxes,seeds", [((6, 6), 1, 25), ((7, 7), 2, 6)])
@pytest.mark.parametrize("moves", [1, 2, 3, 5, 8, 13])
def test_levels_take_exactly_the_asked_moves(dim_room, num_boxes, seeds, moves):
    env = grl.envs.make(
        "sokoban", dim_room=list(dim_room), num_boxes=num_boxes, solution_moves=moves, max_steps=100
    )
    for seed in range(seeds):
        env.reset(seed)
        assert optimal_moves(env.level) == moves, f"seed {seed}\n{env.render()}"


def test_first_level_is_one_push_from_the_target():
    env = grl.envs.make("sokoban", solution_moves=1)
    for seed in range(30):
        env.reset(seed)
        (box,) = env.level.boxes
        (target,) = env.level.targets
        move = (box[0] - env.level.player[0], box[1] - env.level.player[1])
        assert move in MOVES and (box[0] + move[0], box[1] + move[1]) == target, env.render()


@pytest.mark.parametrize("dim_room,num_boxes", [((6, 6), 1), ((5, 6), 2)])
def test_too_many_moves_gives_the_farthest_state_of_its_room(dim_room, num_boxes):
    for seed in range(4):
        level = generate_level_by_moves(seed, dim_room, num_boxes, 500)
        distances = every_state_distance(level)
        assert 0 < optimal_moves(level) == max(distances.values()) < 500


def test_layers_hold_each_state_at_its_optimal_distance():
    rows, cols = 5, 6
    floor = {r * cols + c for r in range(1, rows - 1) for c in range(1, cols - 1)} - {2 * cols + 2}
    targets = frozenset({cols + 1, 3 * cols + 4})
    layers = solution_layers(floor, cols, targets, max_moves=1000)
    cells = frozenset(divmod(p, cols) for p in targets)
    walls = frozenset((r, c) for r in range(rows) for c in range(cols) if r * cols + c not in floor)
    room = Level(rows, cols, walls, cells, cells, (0, 0))
    found = {
        (divmod(player, cols), frozenset(divmod(b, cols) for b in boxes)): depth
        for depth, layer in enumerate(layers)
        for player, boxes in layer
    }
    assert sum(map(len, layers)) == len(found)  # no state listed twice
    assert found == every_state_distance(room)
    # a depth bound keeps the layers up to it
    assert solution_layers(floor, cols, targets, max_moves=4) == layers[:5]


def test_same_seed_same_level_and_seeds_differ():
    a = grl.envs.make("sokoban", solution_moves=5)
    b = grl.envs.make("sokoban", solution_moves=5)
    levels = [a.reset(seed) for seed in range(20)]
    assert levels == [b.reset(seed) for seed in range(20)]
    assert len(set(levels)) >= 18
    # the key picks the generator: without it the same seed makes the search_depth level
    assert render(generate_level_by_moves(3, (6, 6), 1, 5)) == levels[3] != grl.envs.make("sokoban").reset(3)


def test_optimal_plan_solves_in_exactly_the_asked_moves_through_step():
    from grl.envs.solvers import solve_sokoban

    env = grl.envs.make("sokoban", dim_room=(8, 8), num_boxes=2, solution_moves=7)
    for seed in range(10):
        plan = solve_sokoban(env.reset(seed))
        assert len(plan) == 7
        results = [env.step(action) for action in plan]
        assert [r[3]["success"] for r in results] == [False] * 6 + [True]
