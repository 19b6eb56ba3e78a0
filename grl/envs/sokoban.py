"""Sokoban: push every box onto a target.

Rules
- The room is a grid of walls and floor; some floor cells are targets. The
  player moves one cell per action: `Up`, `Down`, `Left` or `Right` (case and
  surrounding whitespace are ignored). Walking into a box pushes it one cell if
  the cell behind it is floor without a box; otherwise, and when walking into a
  wall, nothing moves (the action is valid but not effective).
- Any other action string is invalid: nothing moves, `action_is_valid` is
  False. It still costs the step penalty and counts towards `max_steps`.
- Rewards per step: -0.1, +1 for each box pushed onto a target, -1 for each
  box pushed off one, +10 when the last box lands on a target.
- The episode ends when every box is on a target (`success`) or after
  `max_steps` actions. Steps after the end change nothing and earn 0.
- Observation: the grid, rows joined by newlines, with `#` wall, `_` floor,
  `O` target, `X` box, `√` box on target, `P` player, `S` player on target.

Levels
- Generated (default): a random walk carves a room of `dim_room` (rows, cols)
  inside a wall border; `num_boxes` targets and the player are placed on its
  floor. Starting from the solved state (boxes on the targets), a breadth-first
  search plays the game backwards (the player walks and pulls boxes) for up to
  `search_depth` pulls, and the most scrambled state found is kept: the most
  boxes off target, then the largest total box-to-nearest-target distance,
  then the most pulls. Every forward push undoes one pull, so each level is
  solvable. The same seed gives the same level.
- Fixed: `level` is one level in Boxoban notation (`#` wall, space floor,
  `.` target, `$` box, `*` box on target, `@` player, `+` player on target);
  `levels_path` is a Boxoban file (levels after `; N` lines) and the seed picks
  level `seed % count`. `num_boxes`, `dim_room` and `search_depth` are then
  ignored.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grl.envs.base import Env, step_info, positive_int

ACTIONS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

STEP_REWARD = -0.1
BOX_ON_REWARD = 1.0
BOX_OFF_REWARD = -1.0
SOLVED_REWARD = 10.0

# The reverse search stops after this many distinct states, so that large
# rooms with many boxes still generate in bounded time.
MAX_REVERSE_STATES = 5_000
MAX_GENERATION_TRIES = 100

Cell = tuple[int, int]


@dataclass(frozen=True)
class Level:
    rows: int
    cols: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell


def render(level: Level, boxes=None, player: Cell | None = None) -> str:
    """The grid as text; `boxes`/`player` override the level's own."""
    boxes = level.boxes if boxes is None else boxes
    player = level.player if player is None else player
    lines = []
    for r in range(level.rows):
        row = []
        for c in range(level.cols):
            cell = (r, c)
            on_target = cell in level.targets
            if cell in level.walls:
                row.append("#")
            elif cell == player:
                row.append("S" if on_target else "P")
            elif cell in boxes:
                row.append("√" if on_target else "X")
            else:
                row.append("O" if on_target else "_")
        lines.append("".join(row))
    return "\n".join(lines)


def scramble(level: Level) -> float:
    """Mean Manhattan distance from each box to its nearest target."""
    total = sum(min(abs(br - tr) + abs(bc - tc) for tr, tc in level.targets) for br, bc in level.boxes)
    return total / len(level.boxes)


# ---------------------------------------------------------------- parsing


def _flood(start: Cell, passable) -> set[Cell]:
    seen, todo = {start}, [start]
    while todo:
        r, c = todo.pop()
        for dr, dc in ACTIONS.values():
            nxt = (r + dr, c + dc)
            if nxt not in seen and passable(nxt):
                seen.add(nxt)
                todo.append(nxt)
    return seen


def parse_level(text: str) -> Level:
    """A level in Boxoban notation (`-` and `_` are also read as floor). Raises ValueError saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"sokoban level must be a string in Boxoban notation, got {type(text).__name__}")
    lines = [line.rstrip("\r") for line in text.split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError("sokoban level is empty")
    rows, cols = len(lines), max(len(line) for line in lines)
    walls, floor, targets, boxes, players = set(), set(), set(), set(), []
    for r, line in enumerate(lines):
        # Short rows are closed with wall: those cells are outside the room.
        for c, ch in enumerate(line.ljust(cols, "#")):
            cell = (r, c)
            if ch == "#":
                walls.add(cell)
                continue
            if ch not in " .$*@+-_":
                raise ValueError(f"sokoban level has an unknown symbol {ch!r} at row {r}, column {c}")
            floor.add(cell)
            if ch in ".*+":
                targets.add(cell)
            if ch in "$*":
                boxes.add(cell)
            if ch in "@+":
                players.append(cell)
    if len(players) != 1:
        raise ValueError(f"sokoban level needs exactly one player (@ or +), found {len(players)}")
    if not boxes or len(boxes) != len(targets):
        raise ValueError(
            f"sokoban level needs as many boxes as targets (at least one), found {len(boxes)} boxes and {len(targets)} targets"
        )
    if boxes == targets:
        raise ValueError("sokoban level is already solved (every box is on a target)")
    # Floor outside the outer wall (leading spaces) is shown as wall.
    inside = _flood(players[0], lambda cell: cell in floor)
    walls |= {cell for cell in floor - inside if cell not in boxes and cell not in targets}
    return Level(rows, cols, frozenset(walls), frozenset(targets), frozenset(boxes), players[0])


def load_levels(path: str | Path) -> list[str]:
    """The levels of a Boxoban file: blocks of lines after `; N` headers."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"sokoban levels_path {str(path)!r} is not a file")
    blocks, current = [], []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith(";"):
            blocks.append(current)
            current = []
        else:
            current.append(line)
    blocks.append(current)
    levels = ["\n".join(block) for block in blocks if any(line.strip() for line in block)]
    if not levels:
        raise ValueError(f"sokoban levels_path {str(path)!r} holds no level")
    return levels


# ------------------------------------------------------------- generation


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
        player = rng.choice(reach)
        walls = frozenset((r, c) for r in range(rows) for c in range(cols) if r * cols + c not in floor)
        targets, boxes = (frozenset(divmod(p, cols) for p in cells) for cells in (targets, boxes))
        return Level(rows, cols, walls, targets, boxes, divmod(player, cols))
    raise RuntimeError(
        f"sokoban: no scrambled level for dim_room={dim_room}, num_boxes={num_boxes} after {MAX_GENERATION_TRIES} rooms"
    )


# -------------------------------------------------------------------- env


def parse_action(action: Any) -> tuple[int, int] | None:
    """The move of an action string, or None when it is not one of the four."""
    if not isinstance(action, str):
        return None
    return ACTIONS.get(action.strip().lower())


class SokobanEnv(Env):
    def __init__(
        self,
        dim_room: tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 100,
        search_depth: int = 100,
        level: str | None = None,
        levels_path: str | None = None,
    ):
        if level is not None and levels_path is not None:
            raise ValueError("sokoban: give either `level` or `levels_path`, not both")
        try:
            rows, cols = (int(x) for x in dim_room)
        except (TypeError, ValueError):
            raise ValueError(f"sokoban: dim_room must be two integers (rows, cols), got {dim_room!r}") from None
        num_boxes = positive_int("sokoban", "num_boxes", num_boxes)
        max_steps = positive_int("sokoban", "max_steps", max_steps)
        search_depth = positive_int("sokoban", "search_depth", search_depth)
        if min(rows, cols) < 3 or (rows - 2) * (cols - 2) < num_boxes + 2:
            raise ValueError(f"sokoban: dim_room={dim_room!r} is too small for num_boxes={num_boxes}")
        self.dim_room = (rows, cols)
        self.num_boxes, self.max_steps, self.search_depth = num_boxes, max_steps, search_depth
        # Fixed levels stay text until drawn: a Boxoban file holds a thousand of them.
        self._fixed: list[str] | None = None
        if level is not None:
            parse_level(level)  # fail now, with the reason, rather than at reset
            self._fixed = [level]
        elif levels_path is not None:
            self._fixed = load_levels(levels_path)
        self.level: Level | None = None

    def reset(self, seed: int | None = None) -> str:
        if self._fixed is None:
            self.level = generate_level(seed, self.dim_room, self.num_boxes, self.search_depth)
        else:
            index = (seed if seed is not None else random.randrange(len(self._fixed))) % len(self._fixed)
            try:
                self.level = parse_level(self._fixed[index])
            except ValueError as err:
                raise ValueError(f"sokoban: level {index} of levels_path: {err}") from None
        self.boxes = set(self.level.boxes)
        self.player = self.level.player
        self.steps = 0
        self.done = False
        return self.render()

    def render(self) -> str:
        return render(self.level, self.boxes, self.player)

    def _free(self, cell: Cell) -> bool:
        r, c = cell
        inside = 0 <= r < self.level.rows and 0 <= c < self.level.cols
        return inside and cell not in self.level.walls and cell not in self.boxes

    def step(self, action: str):
        if self.done:
            return self.render(), 0.0, True, step_info(self.solved, parse_action(action) is not None, False)
        move = parse_action(action)
        self.steps += 1
        reward, effective = STEP_REWARD, False
        if move is not None:
            ahead = (self.player[0] + move[0], self.player[1] + move[1])
            if ahead in self.boxes:
                beyond = (ahead[0] + move[0], ahead[1] + move[1])
                if self._free(beyond):
                    self.boxes.remove(ahead)
                    self.boxes.add(beyond)
                    reward += BOX_ON_REWARD * (beyond in self.level.targets) + BOX_OFF_REWARD * (ahead in self.level.targets)
                    self.player, effective = ahead, True
            elif self._free(ahead):
                self.player, effective = ahead, True
        solved = self.solved
        if solved:
            reward += SOLVED_REWARD
        self.done = solved or self.steps >= self.max_steps
        return self.render(), reward, self.done, step_info(solved, move is not None, effective)

    @property
    def solved(self) -> bool:
        return self.boxes == self.level.targets

    def valid_actions(self) -> list[str]:
        # A move into a wall is valid (it only has no effect), as in gym-sokoban.
        return ["Up", "Down", "Left", "Right"]

    def legend(self) -> str:
        return "Symbols: # wall, _ floor, O target, X box, √ box on target, P player, S player on target."

    def action_help(self) -> str:
        return (
            "Actions: Up, Down, Left, Right (one per move). Moving into a box pushes it one cell if the "
            "cell behind it is free. Goal: push every box onto a target."
        )
