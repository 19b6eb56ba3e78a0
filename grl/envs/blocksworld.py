"""BlocksWorld: restack numbered blocks into a goal arrangement.

Rules
- `num_blocks` blocks (2 to 7) numbered from 1 stand in stacks on a table. A
  state says, for each block, what it stands on: 0 for the table, else the
  number of the block below it.
- The seed draws a start state and a different goal state, uniformly from all
  valid states, which are enumerated in code (13 for 3 blocks, 73 for 4).
  The same seed gives the same pair.
- Action: `move X to Y` puts clear block X (nothing on it) on clear block Y,
  or on the table when Y is 0 (or `table`). Case, surrounding whitespace,
  enclosing brackets, a trailing period and the word `block` before a
  number are tolerated; `onto` or `on` may replace `to`.
- Rewards: a legal move costs -1; the move that reaches the goal earns +10
  instead and ends the episode with success. A parsed but illegal move
  (unknown block, X == Y, X or Y covered) costs -1, is flagged invalid and
  changes nothing. An unparseable action costs -5, is flagged invalid and
  changes nothing. Moving a block to where it already stands is legal but
  not effective. The episode also ends after `max_steps` actions of any kind;
  steps after the end change nothing and earn 0.
- Observation (`render_mode`): `text` describes each block in words; `1d`
  gives the list of what blocks 1..n stand on; `2d_sparse` draws the stacks
  as ASCII art, bottom row on the table line. Each shows the current state,
  then the goal.
- `env.optimal_plan_length` is the length of a shortest plan from the start
  state to the goal (breadth-first search).
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from grl.envs.base import Env, step_info, positive_int
from grl.envs.solvers import solve_blocksworld

RENDER_MODES = ("text", "1d", "2d_sparse")
MAX_BLOCKS = 7  # 37,633 states; 8 blocks would enumerate 394,353

MOVE_REWARD = -1.0
ILLEGAL_REWARD = -1.0
UNPARSEABLE_REWARD = -5.0
GOAL_REWARD = 10.0

_MOVE = re.compile(r"move\s+(?:block\s+)?(\d+)\s+(?:to|onto|on)\s+(?:(?:block\s+)?(\d+)|(?:the\s+)?(table))")

State = tuple[int, ...]


@functools.lru_cache(maxsize=None)
def all_states(num_blocks: int) -> tuple[State, ...]:
    """Every valid state of `num_blocks` blocks, sorted.

    Blocks are added in order; each one starts a new stack or slides into any
    position of an existing stack. Removing the highest block undoes this
    uniquely, so every arrangement is made exactly once.
    """
    arrangements: list[list[list[int]]] = [[]]
    for block in range(1, num_blocks + 1):
        grown = []
        for stacks in arrangements:
            grown.append([*stacks, [block]])
            for i, stack in enumerate(stacks):
                for pos in range(len(stack) + 1):
                    grown.append([*stacks[:i], [*stack[:pos], block, *stack[pos:]], *stacks[i + 1 :]])
        arrangements = grown
    return tuple(sorted(_to_state(stacks, num_blocks) for stacks in arrangements))


def _to_state(stacks: list[list[int]], num_blocks: int) -> State:
    on = [0] * num_blocks
    for stack in stacks:
        for below, above in zip(stack, stack[1:]):
            on[above - 1] = below
    return tuple(on)


def stacks_of(state: State) -> list[list[int]]:
    """Stacks bottom to top, ordered by their bottom block."""
    above = {below: block for block, below in enumerate(state, 1) if below}
    stacks = []
    for bottom in (block for block, below in enumerate(state, 1) if below == 0):
        stack = [bottom]
        while stack[-1] in above:
            stack.append(above[stack[-1]])
        stacks.append(stack)
    return stacks


def parse_action(action: Any) -> tuple[int, int] | None:
    """`(block, destination)` of a `move X to Y` string, or None if it does not parse."""
    if not isinstance(action, str):
        return None
    text = action.strip().lower().rstrip(".").strip()
    if len(text) >= 2 and text[0] + text[-1] in ("()", "[]", "{}", "<>", '""', "''", "``"):
        text = text[1:-1].strip()
    match = _MOVE.fullmatch(text)
    if match is None:
        return None
    block, dest, table = match.groups()
    return int(block), 0 if table else int(dest)


def describe(state: State) -> str:
    return " ".join(
        f"Block {block} is on the table." if below == 0 else f"Block {block} is on top of Block {below}."
        for block, below in enumerate(state, 1)
    )


def draw(state: State) -> list[str]:
    """The stacks as ASCII art: one `[n]` per block, the table line below."""
    stacks = stacks_of(state)
    height = max(len(stack) for stack in stacks)
    lines = []
    for level in range(height - 1, -1, -1):
        cells = [f"[{stack[level]}]" if level < len(stack) else "   " for stack in stacks]
        lines.append(" ".join(cells).rstrip())
    lines.append("=" * (4 * len(stacks) - 1))
    return lines


class BlocksWorldEnv(Env):
    def __init__(self, num_blocks: int = 3, render_mode: str = "text", max_steps: int = 20):
        self.num_blocks = positive_int("blocksworld", "num_blocks", num_blocks)
        if not 2 <= self.num_blocks <= MAX_BLOCKS:
            raise ValueError(f"blocksworld: num_blocks must be 2 to {MAX_BLOCKS}, got {num_blocks!r}")
        if render_mode not in RENDER_MODES:
            raise ValueError(
                f"blocksworld: render_mode must be one of {', '.join(RENDER_MODES)}, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.max_steps = positive_int("blocksworld", "max_steps", max_steps)

    def reset(self, seed: int | None = None) -> str:
        rng = random.Random(seed)
        states = all_states(self.num_blocks)
        self.start = rng.choice(states)
        self.goal = rng.choice([s for s in states if s != self.start])
        self.state = self.start
        self.steps = 0
        self.done = False
        self._optimal: int | None = None
        return self.render()

    @property
    def optimal_plan_length(self) -> int:
        """Moves in a shortest plan from this episode's start state to its goal (searched once, on first
        use)."""
        if self._optimal is None:
            self._optimal = len(solve_blocksworld(self.start, self.goal))
        return self._optimal

    def render(self) -> str:
        if self.render_mode == "text":
            return f"Current state: {describe(self.state)}\nGoal state: {describe(self.goal)}"
        if self.render_mode == "1d":
            return f"Current state: {list(self.state)}\nGoal state: {list(self.goal)}"
        return "\n".join(["Current state:", *draw(self.state), "", "Goal state:", *draw(self.goal)])

    def _legal(self, block: int, dest: int) -> bool:
        n = self.num_blocks
        if not (1 <= block <= n and 0 <= dest <= n) or block == dest:
            return False
        covered = set(self.state)
        # dest may be covered by `block` itself: a legal move that changes nothing
        return block not in covered and (dest == 0 or dest not in covered or self.state[block - 1] == dest)

    def step(self, action: str):
        move = parse_action(action)
        if self.done:
            valid = move is not None and self._legal(*move)
            return self.render(), 0.0, True, step_info(self.state == self.goal, valid, False)
        self.steps += 1
        if move is None:
            reward, valid, effective = UNPARSEABLE_REWARD, False, False
        elif not self._legal(*move):
            reward, valid, effective = ILLEGAL_REWARD, False, False
        else:
            block, dest = move
            effective = self.state[block - 1] != dest
            self.state = self.state[: block - 1] + (dest,) + self.state[block:]
            valid = True
            reward = GOAL_REWARD if self.state == self.goal else MOVE_REWARD
        success = self.state == self.goal
        self.done = success or self.steps >= self.max_steps
        return self.render(), reward, self.done, step_info(success, valid, effective)

    def valid_actions(self) -> list[str]:
        n = self.num_blocks
        return [
            f"move {block} to {dest}"
            for block in range(1, n + 1)
            for dest in range(n + 1)
            if self._legal(block, dest)
        ]

    def legend(self) -> str:
        if self.render_mode == "1d":
            return (
                "The list gives, for blocks 1, 2, 3, ... in order, the block each one stands on (0 = the "
                "table)."
            )
        if self.render_mode == "2d_sparse":
            return "Each [n] is block n; a block stands on the one drawn below it; === is the table."
        return ""

    def action_help(self) -> str:
        return (
            "Action: move X to Y, which puts block X on block Y, or on the table when Y is 0. "
            "Only a block with nothing on it can move, and only onto a block with nothing on it. "
            "Goal: reach the goal state."
        )
