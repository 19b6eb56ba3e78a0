"""TextWorld: generated games are won by their walkthrough with full score, a seed is the same game in
any process, and only admissible commands ever reach the game.

Games are generated into the GRL cache ($GRL_CACHE_DIR, else ~/.cache/grl), so only the first run on a
machine pays for the 18 games (about a minute and a half on a slow machine; Inform 7 compiles each); later
runs load them.
"""

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import grl.envs  # noqa: E402
from grl.envs.textworld import TextWorldEnv, generate_game  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEEDS = range(6)  # per level; a cold cache compiles each game (4-6 s on 2 cores), so a few suffice


@pytest.fixture(scope="module")
def envs():
    made = {level: TextWorldEnv(level=level) for level in ("easy", "medium", "hard")}
    yield made
    for env in made.values():
        env.close()


def play(env, commands):
    """Each command must be admissible at its turn; returns the summed reward and the last step."""
    total, last = 0.0, None
    for turn, command in enumerate(commands):
        assert command in env.valid_actions(), (turn, command, env.valid_actions())
        assert last is None or not last[2]  # the game did not end before its last command
        last = env.step(command)
        total += last[1]
        assert last[3]["action_is_valid"]
    return total, last


@pytest.mark.slow
@pytest.mark.parametrize("level", ["easy", "medium", "hard"])
def test_walkthrough_wins_with_full_score(envs, level):
    env = envs[level]
    for seed in SEEDS:
        env.reset(seed)
        total, (_, _, done, info) = play(env, env.walkthrough())
        assert done and info["success"], (level, seed)
        assert total == info["score"] == info["max_score"] > 0, (level, seed)
        assert env.valid_actions() == []
        _, reward, done, info = env.step("look")  # a finished game stays finished and won
        assert (reward, done, info["success"], info["action_is_valid"]) == (0.0, True, True, False)


FRESH_PROCESS = """
import json, sys
from grl.envs.textworld import TextWorldEnv, generate_game
path = generate_game("tw-cooking", "medium", 5, root=__import__("pathlib").Path(sys.argv[1]))
env = TextWorldEnv(level="medium", cache_dir=sys.argv[1])
print(json.dumps({"start": env.reset(5), "walkthrough": env.walkthrough(),
                  "game": path.with_suffix(".json").read_text()}))
env.close()
"""


def same_game(serialized: str) -> dict:
    """A game's description less where its grammar files were read from, which names the install folder."""
    game = json.loads(serialized)
    game["KB"].pop("text_grammars_path", None)
    return game


@pytest.mark.slow
def test_same_seed_same_game_in_a_fresh_process(tmp_path, envs):
    runs = []
    for name in ("a", "b"):
        out = subprocess.run(
            [sys.executable, "-c", FRESH_PROCESS, str(tmp_path / name)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1]
    here = envs["medium"]
    assert here.reset(5) == runs[0]["start"] and here.walkthrough() == runs[0]["walkthrough"]
    cached_here = generate_game("tw-cooking", "medium", 5).with_suffix(".json").read_text()
    assert same_game(cached_here) == same_game(runs[0]["game"])
    other = TextWorldEnv(level="medium")
    assert other.reset(6) != runs[0]["start"] or other.walkthrough() != runs[0]["walkthrough"]
    other.close()


GARBAGE = [
    "",
    "   ",
    "\n",
    "x" * 100_000,
    "\x00\xff\ufffe\u202e",
    "go nowhere",
    "quit",
    "restart",
    "save",
    "undo",
    "open fridge; eat meal",
    "take red bell pepper from fridge\nprepare meal",
    None,
    12,
    b"look",
]


def test_non_admissible_commands_are_invalid_and_change_nothing(envs):
    env = envs["easy"]
    start = env.reset(0)
    valid = env.valid_actions()
    for command in GARBAGE:
        obs, reward, done, info = env.step(command)
        assert isinstance(obs, str) and start in obs
        assert (reward, done, info["action_is_valid"], info["action_is_effective"], info["success"]) == (
            0.0,
            False,
            False,
            False,
            False,
        )
        assert env.valid_actions() == valid
    total, (_, _, done, info) = play(env, env.walkthrough())  # the game is where it started
    assert done and info["success"] and total == info["max_score"]


def test_commands_are_matched_up_to_case_and_spacing(envs):
    env = envs["easy"]
    env.reset(1)
    first = env.walkthrough()[0]
    _, _, _, info = env.step("  " + first.upper().replace(" ", "   ") + " \n")
    assert info["action_is_valid"] and info["action_is_effective"]


def test_looking_is_valid_but_not_effective(envs):
    env = envs["easy"]
    env.reset(2)
    obs, reward, done, info = env.step("look")
    assert info["action_is_valid"] and not info["action_is_effective"] and reward == 0.0 and not done
    assert "Valid commands: " in obs


def test_a_folder_of_games_is_played_instead(tmp_path, envs):
    for seed in (3, 4):
        game = generate_game("tw-cooking", "easy", seed)
        for suffix in (".z8", ".json"):
            shutil.copy(game.with_suffix(suffix), tmp_path / f"cooking{seed}{suffix}")
    env = TextWorldEnv(games_dir=str(tmp_path), list_commands=False)
    for seed in (0, 1, 2):
        start = env.reset(seed)
        assert "Valid commands" not in start
        envs["easy"].reset(3 + seed % 2)
        assert env.walkthrough() == envs["easy"].walkthrough()
        total, (_, _, done, info) = play(env, env.walkthrough())
        assert done and info["success"] and total == info["max_score"]
    env.close()


def test_step_after_close_never_raises():
    env = grl.envs.make("textworld")
    env.reset(0)
    env.close()
    obs, reward, done, info = env.step("look")
    assert done and not info["action_is_valid"] and env.valid_actions() == []
    env.close()


@pytest.mark.parametrize(
    "config, message",
    [
        ({"challenge": "tw-cookin"}, "challenge must be one of"),
        ({"level": "expert"}, "level must be one of"),
        ({"games_dir": "/no/such/folder"}, "games_dir '/no/such/folder' is not a folder"),
    ],
)
def test_bad_config_is_one_clear_line(config, message):
    with pytest.raises(ValueError, match=message):
        TextWorldEnv(**config)


def test_an_empty_games_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="holds no .z8 or .ulx game"):
        TextWorldEnv(games_dir=str(tmp_path))


def test_eating_an_ingredient_of_the_recipe_loses(envs):
    env = envs["easy"]
    env.reset(0)
    take = next(c for c in env.walkthrough() if c.startswith("take "))
    env.step(take)
    food = take[len("take ") :].rsplit(" from ", 1)[0]
    _, reward, done, info = env.step(f"eat {food}")
    assert done and info["action_is_valid"] and not info["success"] and env.valid_actions() == []


def test_a_game_without_its_json_is_refused(tmp_path):
    shutil.copy(generate_game("tw-cooking", "easy", 0), tmp_path / "bare.z8")
    with pytest.raises(ValueError, match="bare.z8 has no .json beside it"):
        TextWorldEnv(games_dir=str(tmp_path))


@pytest.mark.slow
def test_envs_on_threads_play_as_they_do_alone(envs):
    """Rollouts step many envs on threads; each game (its own interpreter) must not see the others."""

    def transcript(env, seed):
        lines = [env.reset(seed)]
        for command in env.walkthrough():
            obs, reward, done, info = env.step(command)
            lines.append((obs, reward, done, info["success"]))
        return lines

    seeds = [0, 1, 2, 3, 4, 5, 6, 7]
    alone = [transcript(envs["medium"], seed) for seed in seeds]
    together, threads = [None] * len(seeds), []
    start = threading.Barrier(len(seeds))  # every thread loads its game at the same moment
    for i, seed in enumerate(seeds):

        def run(i=i, seed=seed):
            env = TextWorldEnv(level="medium")
            start.wait()
            together[i] = transcript(env, seed)
            env.close()

        threads.append(threading.Thread(target=run))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone


COLD_THREADS = """
import threading
from grl.envs.textworld import TextWorldEnv
envs = [TextWorldEnv(level="easy") for _ in range(8)]
start, errors = threading.Barrier(8), []
def run(i):
    start.wait()
    try:
        envs[i].reset(i)
    except Exception as err:
        errors.append(repr(err))
threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(errors)
"""


@pytest.mark.slow
def test_first_resets_of_a_process_on_threads_at_once(envs):
    """A rollout's first resets load TextWorld's rules on several threads at once (its parser is shared)."""
    for seed in range(8):
        envs["easy"].reset(seed)  # the games are built, so the child only loads them
    out = subprocess.run(
        [sys.executable, "-c", COLD_THREADS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
