"""GEM's environments through grl.envs.gem: every offline game (and a reasoning-gym task) plays exactly as
GEM's own env stepped directly with the same seed and actions; valid actions are the accepted ones."""

import copy
import random
import subprocess
import sys
import threading

import gem
import pytest

import grl.envs

NUMBERS = [r"\boxed{%d}" % n for n in range(0, 13)]
CODES = [r"\boxed{%d %d}" % (a, b) for a in range(1, 7) for b in range(1, 7)]
CELLS = [
    r"\boxed{%s %d %d}" % (k, r, c) for k in ("reveal", "flag") for r in range(-1, 6) for c in range(0, 6)
]
ENTRIES = [r"\boxed{%d %d %d}" % (r, c, n) for r in range(0, 5) for c in range(0, 5) for n in range(1, 5)]
TOWERS = [r"\boxed{%s %s}" % (s, d) for s in "ABC" for d in "ABC"]
DIRECTIONS = [r"I move \boxed{%s}." % d for d in ("up", "down", "left", "right", "Up")]
LETTERS = [r"\boxed{%d %d %s}" % (r, c, ch) for r in range(0, 4) for c in range(0, 4) for ch in "aeiost"]
MOVES = NUMBERS + CODES + CELLS + ENTRIES + TOWERS + DIRECTIONS + LETTERS
# Each offline game with moves in its syntax, right and wrong; a move without \boxed{} is a format error.
GAMES = {
    "game:GuessTheNumber-v0-easy": NUMBERS,
    "game:GuessTheNumber-v0-random": NUMBERS,
    "game:Mastermind-v0-easy": CODES,
    "game:Minesweeper-v0-easy": CELLS,
    "game:Sudoku-v0-easy": ENTRIES,
    "game:TowerofHanoi-v0-easy": TOWERS,
    "game:FifteenPuzzle-v0-easy": DIRECTIONS,
    "game:Game2048-v0-easy": DIRECTIONS,
    "game:Sokoban-v0-easy": DIRECTIONS,
    "game:Crosswords-v0-easy": LETTERS,
}


def gem_text(observation, info):
    """GEM's ObservationWrapper for one observation: prefix, the text ending in a newline, suffix."""
    text = observation if not observation or observation.endswith("\n") else observation + "\n"
    return info.get("prefix", "") + text + info.get("suffix", "")


def play(env_id, seed, steps=40):
    """Our env and GEM's, stepped in turn with the same moves; -> the number of steps that were compared."""
    rng = random.Random(seed)
    ours = grl.envs.make("gem", env_id=env_id)
    theirs = gem.make(env_id)
    obs, info = theirs.reset(seed=seed)
    assert ours.reset(seed) == gem_text(obs, info)
    for n in range(1, steps + 1):
        pool = ours.valid_actions() or GAMES[env_id]
        action = rng.choice(pool if rng.random() < 0.9 else MOVES) if n < steps else "no move here"
        got = ours.step(action)
        obs, reward, terminated, truncated, info = theirs.step(action)
        assert got[:3] == (gem_text(obs, info), float(reward), terminated or truncated), (
            env_id,
            seed,
            n,
            action,
        )
        assert (got[3]["terminated"], got[3]["truncated"]) == (terminated, truncated)
        if got[2]:
            return n
    raise AssertionError(f"{env_id}: the episode did not end on a format error")


@pytest.mark.parametrize("env_id", GAMES)
def test_an_episode_equals_gems_own(env_id):
    lengths = [play(env_id, seed) for seed in (0, 7, 123)]
    assert max(lengths) > 1  # at least one episode went past its first move


def test_a_reasoning_gym_task_equals_gems_own_and_a_seed_keeps_its_question():
    ours = grl.envs.make("gem", env_id="rg:leg_counting", env_kwargs={"size": 3})
    theirs = gem.make("rg:leg_counting", size=3)
    for seed in (4, 5, 6):
        question, info = theirs.reset(seed=seed)
        assert ours.reset(seed) == gem_text(question, info)
        answer = theirs.data["answer"]
        got = ours.step(rf"\boxed{{{answer}}}")
        assert (
            got[1:3] == (theirs.step(rf"\boxed{{{answer}}}")[1], True) and got[1] == 1.0 and got[3]["success"]
        )
    first = ours.reset(1)
    for seed in range(8):  # GEM's env draws a new dataset every `size` resets; ours keeps the seed's question
        ours.reset(seed)
    assert ours.reset(1) == first


def test_the_episode_ends_on_its_last_observation_without_a_reset():
    """GEM's vector env would answer the ending step with the next episode's start; ours does not reset."""
    env = grl.envs.make("gem", env_id="game:GuessTheNumber-v0-easy")
    start = env.reset(3)
    obs, reward, done, info = env.step("no guess")
    assert (
        done
        and reward == -0.1
        and obs.startswith("At turn 1, you did not provide a valid guess.")
        and obs != start
    )
    assert env.step(r"\boxed{3}")[2] and env.valid_actions() == []


def probe(env, action):
    """Step a copy. -> (GEM took the move, our valid flag), or None where a hidden mine decided: GEM ends
    the game on revealing a flagged mine but calls revealing a flagged safe cell invalid. GEM took the
    move if the game's visible state changed (not its turn counter, nor the mines Minesweeper lays on the
    first reveal, whether that reveal is valid or not)."""
    hidden = ("turn_count", "grid", "first_reveal")
    copied = copy.deepcopy(env)
    before = {k: copy.deepcopy(v) for k, v in vars(copied._game).items() if k not in hidden}
    obs, _, _, info = copied.step(action)
    if obs.startswith("Game over! You hit a mine"):
        return None
    after = {k: v for k, v in vars(copied._game).items() if k not in hidden}
    return before != after, info["action_is_valid"]


@pytest.mark.parametrize(
    "env_id",
    [
        "game:GuessTheNumber-v0-easy",
        "game:TowerofHanoi-v0-easy",
        "game:Game2048-v0-easy",
        "game:Minesweeper-v0-easy",
    ],
)
def test_valid_actions_are_exactly_the_accepted_ones(env_id):
    """Every listed move is taken, every bare move GEM takes is listed, and the valid flag says which."""
    rng = random.Random(2)
    env = grl.envs.make("gem", env_id=env_id)
    env.reset(5)
    others = rng.sample(MOVES, 40)
    for _ in range(8):
        listed = env.valid_actions()
        assert listed, env_id
        for action in set(GAMES[env_id] + others + listed):
            outcome = probe(env, action)
            if outcome is None:
                continue
            took, flagged = outcome
            assert took == flagged, (env_id, action)
            if action.startswith("\\boxed"):
                assert took == (action in listed), (env_id, action)
        if env.step(rng.choice(listed))[2]:
            env.reset(rng.randrange(100))


def test_envs_on_threads_play_as_they_do_alone():
    """GEM's games draw from the global generators; each of our envs keeps its own, so threads interleave
    freely (2048 draws a new tile after every move)."""
    moves = [r"\boxed{%s}" % d for d in ("up", "left", "down", "right")] * 8

    def episode(seed, out):
        env = grl.envs.make("gem", env_id="game:Game2048-v0-easy")
        out.append(env.reset(seed))
        for move in moves:
            out.append(env.step(move))

    alone = {seed: [] for seed in range(4)}
    for seed, out in alone.items():
        episode(seed, out)
    together = {seed: [] for seed in range(4)}
    threads = [threading.Thread(target=episode, args=(seed, out)) for seed, out in together.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    assert alone[0] != alone[1]


@pytest.mark.parametrize(
    "env_id, message",
    [
        ("game:NotAGame-v0", "is not a GEM env id"),
        (
            "game:FifteenPuzzle-v0-random",
            "cannot be built here: TypeError",
        ),  # a fault in gem-llm 0.1.0 itself
    ],
)
def test_an_id_that_cannot_run_fails_in_one_line(env_id, message):
    with pytest.raises(ValueError, match=message) as err:
        grl.envs.make("gem", env_id=env_id)
    assert "\n" not in str(err.value) and env_id in str(err.value)


def test_a_gem_task_instance_plays_through_the_agent():
    from grl.agents import make_agent
    from grl.config import load_config, task_instance

    agent = make_agent(
        "gemAgent_TowerofHanoi_easy", task_instance(load_config([]), "gemAgent_TowerofHanoi_easy")
    )
    messages = agent.reset(0)
    assert "Tower of Hanoi" in messages[-1]["content"]
    step = agent.step(r"<answer>\boxed{A C}</answer>")
    assert step.info["actions"] == [r"\boxed{A C}"] and step.info["format_ok"] and not step.done
    step = agent.step(r"I move \boxed{A B}")  # no tags: passed whole, as GEM's trainers pass a reply
    assert (
        step.info["actions"] == [r"I move \boxed{A B}"] and not step.info["format_ok"] and step.reward == 0.0
    )


def test_importing_the_adapter_imports_neither_gem_nor_torch():
    code = "import sys, grl.envs.gem; print(any(m in sys.modules for m in ('gem', 'torch', 'reasoning_gym')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
