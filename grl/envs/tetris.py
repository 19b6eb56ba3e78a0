"""Tetris on a small board: drop pieces until a row is full.

Rules
- The board is `dim_x` columns wide and `dim_y` rows tall. Pieces by
  `box_type`: 1 -> a 1x1 block; 2 -> also a vertical and a horizontal
  two-cell piece; 3 -> also the 2x2 square. Pieces never rotate.
- Each piece enters with its top row in the board's top row, at a column the
  seed picks (if that column is blocked, at the nearest column where it fits,
  the left one on a tie); the shape is also drawn from the seed, uniformly
  among the allowed ones. The same seed gives the same piece sequence.
- Actions (case and surrounding whitespace are ignored): `Left` / `Right`
  move the piece one column if the cells are free (else nothing moves: valid,
  not effective); `Down` drops it straight to the lowest free position, where
  it locks (a hard drop: one `Down` places one piece, so every action has a
  visible effect and episodes stay short). Any other string is invalid and
  changes nothing.
- Rewards: `step_reward` (-0.1) for every action (invalid ones included), +10 per row cleared.
  A cost per action makes failing fast pay better than trying: where the
  episode has only one piece, `step_reward: 0` leaves success as the only
  signal.
- The episode ends with success when a drop completes a row (full rows are
  cleared and the rows above fall), and without success when the next piece
  fits in no column of the top rows (the board is full) or after `max_steps`
  actions. A locked piece stays on the board, also at game over. Steps after
  the end change nothing and earn 0.
- Observation: `dim_y` rows of `dim_x` symbols joined by newlines: `_` empty,
  `#` filled, `X` the falling piece. With `coordinates`, a line follows that
  names the falling piece's columns and the empty columns of the lowest row
  that is not full (columns numbered 1 to `dim_x` from the left): the same
  facts, in words a small model reads more easily than a column of a grid.
  With `relative_positions`, a line follows that says where the nearest of
  those empty columns lies from the falling piece's left column ("The gap is
  2 columns left of the piece.", "The piece is right above the gap."): the
  comparison of two column numbers, which a 135M model does not make
  reliably, made once by the env.

Boards where dropping at once is not enough (`gap_rows`, `max_pieces`)
- `gap_rows` bottom rows start filled but for one empty cell each, at a
  column the seed picks; `max_pieces` ends the episode without success once
  that many pieces have locked without clearing a row. With one gap row and
  one piece, a piece dropped where it appears wins only when it appears over
  the gap (1 game in `dim_x`); reading where the gap is wins every game.
  `spawn_over_gap: false` never lets a piece appear over an empty cell of the
  lowest open row (where another column exists), so that no game is won
  without moving: a fixed move sequence then wins at most 1 game in 4 on a
  4-wide board.
"""

from __future__ import annotations

import random
from typing import Any

from grl.envs.base import Env, flag, step_info, positive_int

# Cells of each piece as (row, col) offsets from its top-left corner.
PIECES = {
    "block": ((0, 0),),
    "vertical": ((0, 0), (1, 0)),
    "horizontal": ((0, 0), (0, 1)),
    "square": ((0, 0), (0, 1), (1, 0), (1, 1)),
}
BOX_TYPES = {
    1: ("block",),
    2: ("block", "vertical", "horizontal"),
    3: ("block", "vertical", "horizontal", "square"),
}
ACTIONS = ("left", "right", "down")

LINE_REWARD = 10.0


def parse_action(action: Any) -> str | None:
    """`left`, `right` or `down`, or None when the string is none of them."""
    if not isinstance(action, str):
        return None
    key = action.strip().lower()
    return key if key in ACTIONS else None


class TetrisEnv(Env):
    def __init__(
        self,
        dim_x: int = 4,
        dim_y: int = 4,
        box_type: int = 1,
        max_steps: int = 100,
        gap_rows: int = 0,
        max_pieces: int = 0,
        coordinates: bool = False,
        relative_positions: bool = False,
        step_reward: float = -0.1,
        spawn_over_gap: bool = True,
    ):
        if not isinstance(box_type, int) or box_type not in BOX_TYPES:
            raise ValueError(f"tetris: box_type must be 1, 2 or 3, got {box_type!r}")
        self.dim_x, self.dim_y = (
            positive_int("tetris", "dim_x", dim_x),
            positive_int("tetris", "dim_y", dim_y),
        )
        if min(self.dim_x, self.dim_y) < 2:
            raise ValueError(f"tetris: dim_x and dim_y must be at least 2, got {dim_x!r} x {dim_y!r}")
        self.box_type = int(box_type)
        self.max_steps = positive_int("tetris", "max_steps", max_steps)
        # 0 means "none" for both; the largest piece is two rows tall, so the top two rows stay free.
        self.gap_rows = 0 if gap_rows == 0 else positive_int("tetris", "gap_rows", gap_rows)
        if self.gap_rows > self.dim_y - 2:
            raise ValueError(f"tetris: gap_rows must leave two free rows, got {gap_rows!r} of {dim_y!r}")
        self.max_pieces = 0 if max_pieces == 0 else positive_int("tetris", "max_pieces", max_pieces)
        self.coordinates = flag("tetris", "coordinates", coordinates)
        self.relative_positions = flag("tetris", "relative_positions", relative_positions)
        self.spawn_over_gap = flag("tetris", "spawn_over_gap", spawn_over_gap)
        if (
            isinstance(step_reward, bool)
            or not isinstance(step_reward, (int, float))
            or not -10 < step_reward <= 0
        ):
            raise ValueError(f"tetris: step_reward must be a number in (-10, 0], got {step_reward!r}")
        self.step_reward = float(step_reward)

    # ---------------------------------------------------------- board logic

    def _cells(self, row: int, col: int) -> list[tuple[int, int]]:
        return [(row + dr, col + dc) for dr, dc in PIECES[self.piece]]

    def _fits(self, row: int, col: int) -> bool:
        return all(
            0 <= r < self.dim_y and 0 <= c < self.dim_x and not self.board[r][c]
            for r, c in self._cells(row, col)
        )

    def _spawn(self) -> bool:
        """Draw the next piece into the top rows; False when it fits nowhere (game over)."""
        self.piece = self.rng.choice(BOX_TYPES[self.box_type])
        width = 1 + max(dc for _, dc in PIECES[self.piece])
        off_gap = []
        if not self.spawn_over_gap:
            lowest_open = self._lowest_open_row()
            off_gap = [
                c
                for c in range(self.dim_x - width + 1)
                if all(lowest_open[c + dc] for _, dc in PIECES[self.piece])
            ]
        wanted = self.rng.choice(off_gap) if off_gap else self.rng.randint(0, self.dim_x - width)
        # A blocked column moves the piece to the nearest free one (the left one on a tie).
        for col in sorted(range(self.dim_x - width + 1), key=lambda c: (abs(c - wanted), c)):
            if self._fits(0, col):
                self.row, self.col = 0, col
                return True
        return False

    def _lowest_open_row(self) -> list[bool]:
        return next(row for row in reversed(self.board) if not all(row))  # full rows are cleared at once

    def _drop(self) -> int:
        """Drop and lock the piece; return the number of rows cleared."""
        while self._fits(self.row + 1, self.col):
            self.row += 1
        for r, c in self._cells(self.row, self.col):
            self.board[r][c] = True
        kept = [row for row in self.board if not all(row)]
        cleared = self.dim_y - len(kept)
        self.board = [[False] * self.dim_x for _ in range(cleared)] + kept
        return cleared

    # ------------------------------------------------------------ contract

    def reset(self, seed: int | None = None) -> str:
        self.rng = random.Random(seed)
        self.board = [[False] * self.dim_x for _ in range(self.dim_y - self.gap_rows)]
        for _ in range(self.gap_rows):
            gap = self.rng.randrange(self.dim_x)
            self.board.append([col != gap for col in range(self.dim_x)])
        self.steps = self.pieces_locked = 0
        self.done = False
        self.success = False
        self.falling = self._spawn()  # the top two rows are always empty here
        return self.render()

    def render(self) -> str:
        grid = [["#" if filled else "_" for filled in row] for row in self.board]
        if self.falling:
            for r, c in self._cells(self.row, self.col):
                grid[r][c] = "X"
        lines = ["".join(row) for row in grid]
        lines += [self._describe()] if self.coordinates else []
        lines += [self._relative()] if self.relative_positions and self.falling else []
        return "\n".join(lines)

    def _relative(self) -> str:
        open_cols = [c for c, filled in enumerate(self._lowest_open_row()) if not filled]
        if not open_cols:
            return "The lowest open row has no gap."
        nearest = min(open_cols, key=lambda c: (abs(c - self.col), c))
        offset = nearest - self.col
        if offset == 0:
            return "The piece is right above the gap."
        side, count = ("right" if offset > 0 else "left"), abs(offset)
        return f"The gap is {count} column{'s' if count > 1 else ''} {side} of the piece."

    def _describe(self) -> str:
        def columns(cols) -> str:
            cols = sorted(cols)
            return ("column " if len(cols) == 1 else "columns ") + ", ".join(str(c + 1) for c in cols)

        lowest_open = self._lowest_open_row()
        piece = (
            f"The falling piece is in {columns({c for _, c in self._cells(self.row, self.col)})}. "
            if self.falling
            else "No piece is falling. "
        )
        return (
            piece + f"Empty in the lowest open row: {columns(c for c, f in enumerate(lowest_open) if not f)}."
        )

    def step(self, action: str):
        move = parse_action(action)
        if self.done:
            return self.render(), 0.0, True, step_info(self.success, move is not None, False)
        self.steps += 1
        reward, effective = self.step_reward, False
        if move in ("left", "right"):
            col = self.col + (1 if move == "right" else -1)
            if self._fits(self.row, col):
                self.col, effective = col, True
        elif move == "down":
            effective = True
            cleared = self._drop()
            self.pieces_locked += 1
            reward += LINE_REWARD * cleared
            if cleared:
                self.success = self.done = True
                self.falling = False
            elif self.max_pieces and self.pieces_locked >= self.max_pieces:
                self.falling, self.done = False, True
            else:
                self.falling = self._spawn()
                self.done = not self.falling
        self.done = self.done or self.steps >= self.max_steps
        return self.render(), reward, self.done, step_info(self.success, move is not None, effective)

    def legend(self) -> str:
        return "Symbols: _ empty cell, # filled cell, X the falling piece."

    def valid_actions(self) -> list[str]:
        return [action.capitalize() for action in ACTIONS]

    def action_help(self) -> str:
        return (
            "Actions: Left, Right (move the falling piece one column), Down (drop it to the bottom, "
            "where it locks). Goal: fill a whole row to clear it."
        )
