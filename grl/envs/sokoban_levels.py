"""Sokoban levels: the level type and the generators (grl/envs/sokoban.py documents what they make).

Cells are (row, column) pairs in a `Level`; the generators work on flat indices
(row * cols + column) and turn them into cells at the end.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

ACTIONS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

# The reverse search stops after this many distinct states, so that large
# rooms with many boxes still generate in bounded time.
MAX_REVERSE_STATES = 5_000
MAX_GENERATION_TRIES = 100
# The solution-distance search: at most this many states per room, and this many rooms drawn looking for one
# with a state exactly `solution_moves` moves from solved (a 6x6 one-box room holds about a hundred states).
MAX_DISTANCE_STATES = 20_000
MAX_DISTANCE_ROOMS = 50

Cell = tuple[int, int]


@dataclass(frozen=True)
class Level:
    rows: int
    cols: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell


def scramble(level: Level) -> float:
    """Mean Manhattan distance from each box to its nearest target."""
    total = sum(min(abs(br - tr) + abs(bc - tc) for tr, tc in level.targets) for br, bc in level.boxes)
    return total / len(level.boxes)


def room_level(rows: int, cols: int, floor: set[int], targets, boxes, player: int) -> Level:
    """A Level from flat indices: every cell off the floor is wall."""
    walls = frozenset((r, c) for r in range(rows) for c in range(cols) if r * cols + c not in floor)
    targets, boxes = (frozenset(divmod(p, cols) for p in cells) for cells in (targets, boxes))
    return Level(rows, cols, walls, targets, boxes, divmod(player, cols))


def carve_room(rng: random.Random, rows: int, cols: int) -> set[int]:
    """Floor cells (flat indices) carved by a random walk inside the border.

    The walker carves 55-85% of the interior, keeps its heading with
    probability 0.65 and often widens the corridor by one side cell, which
    gives both corridors and open patches (open rooms let the reverse search
    carry boxes further). Every carved cell touches the previous one, so the
    floor is connected.
    """
    interior = (rows - 2) * (cols - 2)
    goal = max(3, round(interior * rng.uniform(0.55, 0.85)))
    r, c = rng.randint(1, rows - 2), rng.randint(1, cols - 2)
    heading = rng.choice(list(ACTIONS.values()))
    floor = {r * cols + c}
    for _ in range(interior * 20):
        if len(floor) >= goal:
            break
        if rng.random() < 0.35:
            heading = rng.choice(list(ACTIONS.values()))
        r = min(max(r + heading[0], 1), rows - 2)
        c = min(max(c + heading[1], 1), cols - 2)
        floor.add(r * cols + c)
        if rng.random() < 0.4:
            dr, dc = heading[1], heading[0]  # a side of the heading
            sr, sc = r + dr, c + dc
            if 1 <= sr <= rows - 2 and 1 <= sc <= cols - 2:
                floor.add(sr * cols + sc)
    return floor


def reverse_search(floor: set[int], cols: int, targets: frozenset[int], player: int, search_depth: int):
    """Play backwards from the solved state; return the most scrambled (boxes, player region).

    A state is the box set and the region the player can walk to, named by its
    smallest cell. A pull takes a box the player stands next to one cell
    towards the player, who steps back one cell (that cell must be free).
    """
    steps = (-cols, cols, -1, 1)
    neighbours = {p: [p + d for d in steps if p + d in floor] for p in floor}
    target_cells = [divmod(t, cols) for t in targets]

    def region(start: int, boxes: frozenset[int]) -> set[int]:
        seen, todo = {start}, [start]
        while todo:
            for q in neighbours[todo.pop()]:
                if q not in seen and q not in boxes:
                    seen.add(q)
                    todo.append(q)
        return seen

    def score(boxes: frozenset[int], depth: int) -> tuple:
        off, dist = 0, 0
        for b in boxes:
            br, bc = divmod(b, cols)
            nearest = min(abs(br - tr) + abs(bc - tc) for tr, tc in target_cells)
            off += nearest > 0
            dist += nearest
        return (off, dist, depth)

    start_region = region(player, targets)
    best = (score(targets, 0), targets, start_region)
    seen = {(targets, min(start_region))}
    frontier = deque([(targets, start_region, 0)])
    while frontier and len(seen) < MAX_REVERSE_STATES:
        boxes, reach, depth = frontier.popleft()
        if depth >= search_depth:
            continue
        for b in sorted(boxes):
            for d in steps:
                stand, back = b + d, b + 2 * d
                if stand not in reach or back not in floor or back in boxes:
                    continue
                new_boxes = (boxes - {b}) | {stand}
                new_reach = region(back, new_boxes)
                key = (new_boxes, min(new_reach))
                if key in seen:
                    continue
                seen.add(key)
                frontier.append((new_boxes, new_reach, depth + 1))
                candidate = score(new_boxes, depth + 1)
                if candidate > best[0]:
                    best = (candidate, new_boxes, new_reach)
    return best[1], sorted(best[2])


def generate_level(seed: int | None, dim_room: tuple[int, int], num_boxes: int, search_depth: int) -> Level:
    """A solvable level with at least one box off target; the same seed gives the same level."""
    rng = random.Random(seed)
    rows, cols = dim_room
    for _ in range(MAX_GENERATION_TRIES):
        floor = carve_room(rng, rows, cols)
        if len(floor) < num_boxes + 2:
            continue
        cells = sorted(floor)
        picked = rng.sample(cells, num_boxes + 1)
        targets, player = frozenset(picked[1:]), picked[0]
        boxes, reach = reverse_search(floor, cols, targets, player, search_depth)
        if boxes == targets:
            continue  # no pull possible from this layout
        return room_level(rows, cols, floor, targets, boxes, rng.choice(reach))
    raise RuntimeError(
        f"sokoban: no scrambled level for dim_room={dim_room}, num_boxes={num_boxes} after "
        f"{MAX_GENERATION_TRIES} rooms"
    )


def solution_layers(floor: set[int], cols: int, targets: frozenset[int], max_moves: int) -> list[list[tuple]]:
    """States (player, boxes) grouped by the length of their optimal solution in moves, 0 to at most
    `max_moves`.

    A breadth-first search plays moves backwards from every solved state (the
    boxes on the targets, the player on any other floor cell): the player steps
    back onto free floor, and may pull along a box that is on his other side.
    Each backward move undoes one forward move (a walk or a push), so a state
    first met at depth d is solved in d moves and in no fewer. After
    MAX_DISTANCE_STATES states the search stops; the depths it found stay exact.
    """
    steps = (-cols, cols, -1, 1)
    layers = [[(player, targets) for player in sorted(floor - targets)]]
    seen = set(layers[0])
    while len(layers) <= max_moves and len(seen) < MAX_DISTANCE_STATES:
        layer = []
        for player, boxes in layers[-1]:
            for step in steps:
                back, pulled = player - step, player + step
                if back not in floor or back in boxes:
                    continue
                before = [(back, boxes)]
                if pulled in boxes:
                    before.append((back, (boxes - {pulled}) | {player}))
                for state in before:
                    if state not in seen and len(seen) < MAX_DISTANCE_STATES:
                        seen.add(state)
                        layer.append(state)
        if not layer:
            break
        layers.append(layer)
    return layers


def generate_level_by_moves(
    seed: int | None, dim_room: tuple[int, int], num_boxes: int, solution_moves: int
) -> Level:
    """A level whose optimal solution takes `solution_moves` moves, walking included.

    Rooms are drawn (at most MAX_DISTANCE_ROOMS) until one holds a state that
    far from solved, and the level is one such state picked at random; where no
    room does, the level is a state of the farthest room at its largest
    distance, so it is never longer than asked. The same seed gives the same level.
    """
    rng = random.Random(seed)
    rows, cols = dim_room
    farthest = None
    for _ in range(MAX_DISTANCE_ROOMS):
        floor = carve_room(rng, rows, cols)
        if len(floor) < num_boxes + 1:
            continue
        targets = frozenset(rng.sample(sorted(floor), num_boxes))
        layers = solution_layers(floor, cols, targets, solution_moves)
        if farthest is None or len(layers) > len(farthest[0]):
            farthest = (layers, floor, targets)
        if len(layers) > solution_moves:
            break
    if farthest is None or len(farthest[0]) < 2:
        raise RuntimeError(
            f"sokoban: no level with a box off target for dim_room={dim_room}, num_boxes={num_boxes} "
            f"in {MAX_DISTANCE_ROOMS} rooms"
        )
    layers, floor, targets = farthest
    player, boxes = rng.choice(layers[-1])
    return room_level(rows, cols, floor, targets, boxes, player)
