"""Breadth-first solvers: slow, obviously correct references for tests and metrics.

`solve_sokoban` reads a rendered Sokoban observation (the text the model sees)
and returns a shortest list of moves; `solve_blocksworld` returns a shortest
list of `(block, destination)` moves. Both search plain states with BFS, so
their answers are optimal and their code carries no game cleverness that could
share a bug with the envs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable

MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def bfs(
    start: Hashable,
    successors: Callable[[Hashable], Iterable[tuple[object, Hashable]]],
    is_goal: Callable[[Hashable], bool],
    max_states: int = 1_000_000,
) -> list | None:
    """Shortest list of actions from `start` to a goal state; None if none within `max_states`."""
    parent: dict = {start: None}
    frontier = deque([start])
    while frontier:
        state = frontier.popleft()
        if is_goal(state):
            path = []
            while parent[state] is not None:
                state, action = parent[state]
                path.append(action)
            return path[::-1]
        for action, nxt in successors(state):
            if nxt not in parent:
                if len(parent) >= max_states:
                    return None
                parent[nxt] = (state, action)
                frontier.append(nxt)
    return None


def solve_sokoban(observation: str, max_states: int = 1_000_000) -> list[str] | None:
    """Shortest move list that solves a rendered Sokoban grid, or None if it has no solution."""
    grid = observation.split("\n")
    walls, targets, boxes, player = set(), set(), set(), None
    for r, row in enumerate(grid):
        for c, ch in enumerate(row):
            if ch == "#":
                walls.add((r, c))
            if ch in "OS√":
                targets.add((r, c))
            if ch in "X√":
                boxes.add((r, c))
            if ch in "PS":
                player = (r, c)

    def inside(cell) -> bool:
        return 0 <= cell[0] < len(grid) and 0 <= cell[1] < len(grid[cell[0]]) and cell not in walls

    def successors(state):
        (pr, pc), bxs = state
        for name, (dr, dc) in MOVES.items():
            ahead = (pr + dr, pc + dc)
            if not inside(ahead):
                continue
            if ahead in bxs:
                beyond = (ahead[0] + dr, ahead[1] + dc)
                if not inside(beyond) or beyond in bxs:
                    continue
                yield name, (ahead, (bxs - {ahead}) | {beyond})
            else:
                yield name, (ahead, bxs)

    goal = frozenset(targets)
    return bfs((player, frozenset(boxes)), successors, lambda state: state[1] == goal, max_states)


def blocksworld_moves(state: tuple[int, ...]):
    """Every legal `(block, destination)` move of a BlocksWorld state and its result.

    `state[i]` is what block i+1 stands on: 0 for the table, else a block number.
    """
    covered = set(state)
    clear = [b for b in range(1, len(state) + 1) if b not in covered]
    for block in clear:
        for dest in [0, *clear]:
            if dest != block and dest != state[block - 1]:
                nxt = list(state)
                nxt[block - 1] = dest
                yield (block, dest), tuple(nxt)


def solve_blocksworld(start: tuple[int, ...], goal: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """Shortest list of `(block, destination)` moves from `start` to `goal`."""
    goal = tuple(goal)
    return bfs(tuple(start), blocksworld_moves, lambda state: state == goal)
