"""Sokoban level generation: GRL's generator against gym-sokoban's `generate_room`, and GRL's two generators.

For each room size and box count both generators make levels for a fixed time
(or up to a level count) in this process; the bench prints levels per second
and the scramble of the levels (mean Manhattan distance from a box to its
nearest target, the same function for both), each as a ratio ours / gym's.
gym-sokoban's generator is run as its `SokobanEnv` runs it (random-walk steps
= 1.7 x (rows + cols)); a level it rejects (no box moved) costs time and is
retried, as the env does.

The baseline is gym-sokoban's `envs/room_utils.py`, loaded on its own because
the package's `__init__` needs `gym`: install it with
`pip install --no-deps gym-sokoban`, or pass `--room-utils PATH` to a copy of
that file. Without it the bench prints SKIP and exits 0.

First, needing no baseline: levels per second of the generator by solution
length (`solution_moves` = n, the curriculum's key) against the default one
(`search_depth`), as a ratio, and the mean optimal solution length of the
default levels beside n.

Run: python bench/bench_sokoban.py [--seconds 5] [--max-levels 300]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from grl.envs.sokoban import render  # noqa: E402
from grl.envs.sokoban_levels import Level, generate_level, generate_level_by_moves, scramble  # noqa: E402
from grl.envs.solvers import solve_sokoban  # noqa: E402

CONFIGS = [((6, 6), 1), ((8, 8), 1), ((8, 8), 2), ((10, 10), 2)]
SEARCH_DEPTH = 100  # the env default
SOLUTION_MOVES = [1, 3, 8, 13, 21]


def load_room_utils(path: str | None):
    """gym-sokoban's room_utils module, or None with the reason."""
    if path is None:
        spec = importlib.util.find_spec("gym_sokoban")
        if spec is None or not spec.submodule_search_locations:
            return None, "gym-sokoban is not installed (pip install --no-deps gym-sokoban)"
        path = str(Path(spec.submodule_search_locations[0]) / "envs" / "room_utils.py")
    if not Path(path).is_file():
        return None, f"no room_utils.py at {path}"
    try:
        import numpy  # noqa: F401  (room_utils needs it)
    except ImportError:
        return None, "numpy is missing (gym-sokoban's room_utils needs it)"
    module_spec = importlib.util.spec_from_file_location("gym_sokoban_room_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module, None


def gym_level(room_utils, dim, num_boxes) -> Level:
    """One gym-sokoban level (retrying rejected rooms) as a Level."""
    import numpy as np

    while True:
        try:
            structure, state, _ = room_utils.generate_room(
                dim=dim, num_steps=int(1.7 * (dim[0] + dim[1])), num_boxes=num_boxes
            )
            break
        except (RuntimeError, RuntimeWarning):  # gym's "score == 0" / "not enough free spots"
            continue

    def cells(mask) -> frozenset:
        return frozenset(map(tuple, np.argwhere(mask).tolist()))

    # gym's codes: 0 wall, 1 floor, 2 target, 3 box on target, 4 box, 5 player
    return Level(
        rows=dim[0],
        cols=dim[1],
        walls=cells(structure == 0),
        targets=cells(structure == 2),
        boxes=cells((state == 3) | (state == 4)),
        player=tuple(np.argwhere(state == 5)[0].tolist()),
    )


def timed(make_level, seconds: float, max_levels: int):
    """Levels per second and mean scramble of levels made until time or count runs out."""
    start, scrambles = time.perf_counter(), []
    while len(scrambles) < max_levels and (time.perf_counter() - start < seconds or not scrambles):
        scrambles.append(scramble(make_level(len(scrambles))))
    elapsed = time.perf_counter() - start
    return len(scrambles) / elapsed, sum(scrambles) / len(scrambles), len(scrambles)


def by_moves_table(seconds: float, max_levels: int) -> None:
    """Levels per second by solution length, as a ratio to the default generator's."""
    print(
        f"{'room':>7} {'boxes':>5} {'moves':>5} | {'lvl/s':>8} {'vs default':>10} | default's mean optimal "
        "moves"
    )
    for dim, boxes in CONFIGS:
        default = timed(lambda i: generate_level(i, dim, boxes, SEARCH_DEPTH), seconds, max_levels)
        # the solver is slow on large two-box rooms: their mean length is left out
        lengths = (
            [len(solve_sokoban(render(generate_level(i, dim, boxes, SEARCH_DEPTH)))) for i in range(50)]
            if boxes == 1
            else []
        )
        mean = f"{sum(lengths) / len(lengths):.1f}" if lengths else "-"
        room = f"{dim[0]}x{dim[1]}"
        for moves in SOLUTION_MOVES:
            ours = timed(lambda i: generate_level_by_moves(i, dim, boxes, moves), seconds, max_levels)
            print(f"{room:>7} {boxes:>5} {moves:>5} | {ours[0]:>8.1f} {ours[0] / default[0]:>9.2f}x | {mean}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="time per generator and config")
    parser.add_argument("--max-levels", type=int, default=300)
    parser.add_argument("--room-utils", default=None, help="path to gym-sokoban's envs/room_utils.py")
    args = parser.parse_args()

    by_moves_table(args.seconds, args.max_levels)
    room_utils, reason = load_room_utils(args.room_utils)
    if room_utils is None:
        print(f"SKIP bench_sokoban: baseline unavailable: {reason}")
        return
    import numpy as np

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))  # gym's reverse search recurses ~300 deep
    print(
        f"{'room':>7} {'boxes':>5} | {'ours lvl/s':>10} {'gym lvl/s':>9} {'speed x':>8} | "
        f"{'ours scr':>8} {'gym scr':>7} {'scramble x':>10} | levels ours/gym"
    )
    for dim, boxes in CONFIGS:
        ours = timed(lambda i: generate_level(i, dim, boxes, SEARCH_DEPTH), args.seconds, args.max_levels)
        random.seed(0)
        np.random.seed(0)
        gym = timed(lambda i: gym_level(room_utils, dim, boxes), args.seconds, args.max_levels)
        room = f"{dim[0]}x{dim[1]}"
        print(
            f"{room:>7} {boxes:>5} | {ours[0]:>10.1f} {gym[0]:>9.1f} {ours[0] / gym[0]:>7.1f}x | "
            f"{ours[1]:>8.2f} {gym[1]:>7.2f} {ours[1] / gym[1]:>9.2f}x | {ours[2]}/{gym[2]}"
        )


if __name__ == "__main__":
    main()
