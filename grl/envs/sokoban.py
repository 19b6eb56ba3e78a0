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
  box pushed off one, +10 when the last box lands on a target; plus the
  shaping term below where `shaping_weight` > 0.
- The episode ends when every box is on a target (`success`) or after
  `max_steps` actions. Steps after the end change nothing and earn 0.
- Observation: the grid, rows joined by newlines, with `#` wall, `_` floor,
  `O` target, `X` box, `√` box on target, `P` player, `S` player on target.
  With `describe_positions`, a line after it says the same in words: where the
  player stands (row and column, from 1 at the top left), where each box lies
  relative to the player, and where each free target lies relative to the
  nearest box off target. SmolLM2's tokenizer merges runs of `_` and `#`
  (`#____#` is three tokens), so a small model cannot count columns in the
  grid; the words give it the same facts as short tokens.

Levels
- Generated (default): a random walk carves a room of `dim_room` (rows, cols)
  inside a wall border; `num_boxes` targets and the player are placed on its
  floor. Starting from the solved state (boxes on the targets), a breadth-first
  search plays the game backwards (the player walks and pulls boxes) for up to
  `search_depth` pulls, and the most scrambled state found is kept: the most
  boxes off target, then the largest total box-to-nearest-target distance,
  then the most pulls. Every forward push undoes one pull, so each level is
  solvable. The same seed gives the same level.
- By solution length: with `solution_moves` = n, the level's optimal solution
  takes exactly n moves, walking included (n = 1: the player stands at the
  box, one push from its target), or fewer where none of 50 drawn rooms holds
  a state that far. A breadth-first search played backwards from the solved
  boards measures every state's distance (grl/envs/sokoban_levels.py);
  `search_depth` is then ignored. This is the key a curriculum steps
  (`rollout.curriculum.env_key=solution_moves`, levels such as [1, 2, 3, 5, 8]).
- Fixed: `level` is one level in Boxoban notation (`#` wall, space floor,
  `.` target, `$` box, `*` box on target, `@` player, `+` player on target);
  `levels_path` is a Boxoban file (levels after `; N` lines) and the seed picks
  level `seed % count`. `num_boxes`, `dim_room`, `search_depth` and
  `solution_moves` are then ignored.

Shaping (off by default)
- Potential-based shaping (Ng, Harada and Russell 1999): each step adds
  gamma * phi(next) - phi(before), with phi = -shaping_weight * (the sum over
  boxes of the Manhattan distance to the nearest target, plus with
  `shaping_player` the player's Manhattan distance to the nearest box off
  target), and gamma = `shaping_gamma`. Over an episode the terms, step t
  weighted gamma^t, sum to gamma^T phi(last) - phi(first); a loop back to the
  same state earns nothing when gamma = 1.
- gamma = 1 (the default) matches GRL's undiscounted returns (algorithm.gamma
  = 1; an env step is one action, several make a turn). A solved board has
  phi = 0, the most any board has, so no episode that stops short of the
  solution gains against a solving one that it did not beat already: the
  solving policies stay optimal. Among unsolved episodes, cut by `max_steps`
  or the agent's turn limits, the shaped return prefers those ending closer.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from grl.envs.base import Env, flag, positive_int, step_info
from grl.envs.sokoban_levels import ACTIONS, Cell, Level, generate_level, generate_level_by_moves

STEP_REWARD = -0.1
BOX_ON_REWARD = 1.0
BOX_OFF_REWARD = -1.0
SOLVED_REWARD = 10.0


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


def _offset(frm: Cell, to: Cell) -> str:
    (dr, dc) = (to[0] - frm[0], to[1] - frm[1])
    parts = [f"{abs(dr)} {'up' if dr < 0 else 'down'}"] * bool(dr) + [
        f"{abs(dc)} {'left' if dc < 0 else 'right'}"
    ] * bool(dc)
    return " and ".join(parts) or "the same cell"


def describe(level: Level, boxes, player: Cell) -> str:
    """The positions in words: the player, each box from the player, each free target from the nearest box off
    target."""
    places = [f"You are at row {player[0] + 1}, column {player[1] + 1}."]
    loose = sorted(set(boxes) - level.targets)
    for box in sorted(boxes):
        where = "on a target, " if box in level.targets else ""
        places.append(f"Box at row {box[0] + 1}, column {box[1] + 1}: {where}{_offset(player, box)} of you.")
    for target in sorted(level.targets - set(boxes)):
        nearest = min(loose, key=lambda box: abs(box[0] - target[0]) + abs(box[1] - target[1]))
        places.append(
            f"Target at row {target[0] + 1}, column {target[1] + 1}: {_offset(nearest, target)} of the box."
        )
    return " ".join(places)


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
    """A level in Boxoban notation (`-` and `_` are also read as floor). Raises ValueError saying what is
    wrong."""
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
            f"sokoban level needs as many boxes as targets (at least one), found {len(boxes)} boxes and "
            f"{len(targets)} targets"
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


# -------------------------------------------------------------------- env


def parse_action(action: Any) -> tuple[int, int] | None:
    """The move of an action string, or None when it is not one of the four."""
    if not isinstance(action, str):
        return None
    return ACTIONS.get(action.strip().lower())


def shaping_distance(targets, boxes, player: Cell, with_player: bool) -> int:
    """The distance the shaping potential counts: each box's Manhattan distance to its nearest target, and
    with
    `with_player` the player's Manhattan distance to the nearest box off target (0 once every box is on
    one)."""

    def nearest(cell: Cell, cells) -> int:
        return min((abs(cell[0] - r) + abs(cell[1] - c) for r, c in cells), default=0)

    distance = sum(nearest(box, targets) for box in boxes)
    return distance + (nearest(player, [box for box in boxes if box not in targets]) if with_player else 0)


def real_in(key: str, value: Any, low: float, high: float, low_open: bool) -> float:
    """An env_config number in [low, high] (or (low, high] with `low_open`); bools and NaN refused."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not (low < number <= high if low_open else low <= number <= high):
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise ValueError(f"sokoban: {key} must be a number in {interval}, got {value!r}")
    return float(number)


class SokobanEnv(Env):
    def __init__(
        self,
        dim_room: tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 100,
        search_depth: int = 100,
        solution_moves: int | None = None,
        level: str | None = None,
        levels_path: str | None = None,
        shaping_weight: float = 0.0,
        shaping_player: bool = False,
        shaping_gamma: float = 1.0,
        describe_positions: bool = False,
    ):
        if level is not None and levels_path is not None:
            raise ValueError("sokoban: give either `level` or `levels_path`, not both")
        try:
            rows, cols = (int(x) for x in dim_room)
        except (TypeError, ValueError):
            raise ValueError(
                f"sokoban: dim_room must be two integers (rows, cols), got {dim_room!r}"
            ) from None
        num_boxes = positive_int("sokoban", "num_boxes", num_boxes)
        max_steps = positive_int("sokoban", "max_steps", max_steps)
        search_depth = positive_int("sokoban", "search_depth", search_depth)
        if solution_moves is not None:
            solution_moves = positive_int("sokoban", "solution_moves", solution_moves)
        self.shaping_weight = real_in("shaping_weight", shaping_weight, 0.0, 100.0, low_open=False)
        self.shaping_player = flag("sokoban", "shaping_player", shaping_player)
        self.shaping_gamma = real_in("shaping_gamma", shaping_gamma, 0.0, 1.0, low_open=True)
        self.describe_positions = flag("sokoban", "describe_positions", describe_positions)
        if min(rows, cols) < 3 or (rows - 2) * (cols - 2) < num_boxes + 2:
            raise ValueError(f"sokoban: dim_room={dim_room!r} is too small for num_boxes={num_boxes}")
        self.dim_room = (rows, cols)
        self.num_boxes, self.max_steps = num_boxes, max_steps
        self.search_depth, self.solution_moves = search_depth, solution_moves
        # Fixed levels stay text until drawn: a Boxoban file holds a thousand of them.
        self._fixed: list[str] | None = None
        if level is not None:
            parse_level(level)  # fail now, with the reason, rather than at reset
            self._fixed = [level]
        elif levels_path is not None:
            self._fixed = load_levels(levels_path)
        self.level: Level | None = None

    def reset(self, seed: int | None = None) -> str:
        if self._fixed is not None:
            index = (seed if seed is not None else random.randrange(len(self._fixed))) % len(self._fixed)
            try:
                self.level = parse_level(self._fixed[index])
            except ValueError as err:
                raise ValueError(f"sokoban: level {index} of levels_path: {err}") from None
        elif self.solution_moves is not None:
            self.level = generate_level_by_moves(seed, self.dim_room, self.num_boxes, self.solution_moves)
        else:
            self.level = generate_level(seed, self.dim_room, self.num_boxes, self.search_depth)
        self.boxes = set(self.level.boxes)
        self.player = self.level.player
        self.steps = 0
        self.done = False
        self.potential = self._potential()
        return self.render()

    def _potential(self) -> float:
        """Ng et al.'s potential of the current state: minus the weighted shaping distance (0 when solved)."""
        return -self.shaping_weight * shaping_distance(
            self.level.targets, self.boxes, self.player, self.shaping_player
        )

    def render(self) -> str:
        grid = render(self.level, self.boxes, self.player)
        return f"{grid}\n{describe(self.level, self.boxes, self.player)}" if self.describe_positions else grid

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
                    reward += BOX_ON_REWARD * (beyond in self.level.targets) + BOX_OFF_REWARD * (
                        ahead in self.level.targets
                    )
                    self.player, effective = ahead, True
            elif self._free(ahead):
                self.player, effective = ahead, True
        solved = self.solved
        if solved:
            reward += SOLVED_REWARD
        if self.shaping_weight:
            before, self.potential = self.potential, self._potential()
            reward += self.shaping_gamma * self.potential - before
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
