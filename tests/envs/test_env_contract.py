"""The env contract, checked on every env that needs no dataset (and on `math` over a small file): any string
is a
valid input to `step` (never a crash), `info` carries the contract's keys, an invalid action leaves the state
as it was, and
the same seed gives the same episode."""

import json
import random

import pytest

import grl.envs

# Every env GRL registers is checked here, so a new one is covered by adding it to the registry; those
# that need a dataset or a database are exercised by their own tests over shared/data.
NEEDS_DATA = {"gsm8k", "webshop", "bird", "math"}
BUILT_IN = [name for name in grl.envs.names() if grl.envs._REGISTRY[name].startswith("grl.envs.")]
SELF_CONTAINED = [name for name in BUILT_IN if name not in NEEDS_DATA]
ALPHABET = "UpDownLeftRightmove to 0123456789()[]\n\t .,;:|/\\\"'<>√é漢\x00\u202e"


@pytest.fixture(scope="module")
def math_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("math") / "test.jsonl"
    rows = [{"problem": "Compute $1+1$.", "answer": "2"}, {"problem": "Solve $x^2<4$.", "answer": "(-2,2)"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def build(name, math_file):
    return (
        grl.envs.make(name, data_path=str(math_file), max_attempts=3)
        if name == "math"
        else grl.envs.make(name)
    )


@pytest.mark.parametrize("name", SELF_CONTAINED + ["math"])
def test_arbitrary_strings_never_crash(name, math_file):
    rng = random.Random(3)
    env = build(name, math_file)
    start = env.reset(0)
    for _ in range(300):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40)))
        obs, reward, done, info = env.step(text)
        assert isinstance(obs, str) and isinstance(reward, float) and isinstance(done, bool)
        assert set(info) >= {"success", "action_is_valid", "action_is_effective"}
        if not info["action_is_valid"]:
            assert start in obs or done  # the state is unchanged (an env may prepend an error note)
        elif name != "math":  # math's state is the problem, which feedback repeats
            start = obs
        if done:
            start = env.reset(0)


@pytest.mark.parametrize("name", SELF_CONTAINED + ["math"])
def test_same_seed_same_episode(name, math_file):
    first, second = build(name, math_file), build(name, math_file)
    assert first.reset(7) == second.reset(7)
    rng = random.Random(0)
    for _ in range(20):
        action = rng.choice(["Up", "Down", "Left", "Right", "move 1 to 0", "move 2 to 1", "50", "7"])
        assert first.step(action) == second.step(action)


@pytest.mark.parametrize("name", ["sokoban", "tetris", "blocksworld", "guess_number"])  # envs that deepcopy
def test_valid_actions_are_exactly_the_accepted_ones(name):
    """Along random play, every listed action is accepted as valid, and every action of a wide
    candidate set that the env accepts is listed (checked on copies of the env at that state)."""
    import copy

    rng = random.Random(5)
    env = grl.envs.make(name)
    env.reset(11)
    candidates = (
        ["Up", "Down", "Left", "Right"]
        + [str(n) for n in range(0, 102)]
        + [f"move {b} to {d}" for b in range(0, 6) for d in range(0, 6)]
    )
    for _ in range(25):
        listed = env.valid_actions()
        assert listed, f"{name}: no valid action in a running episode"
        for action in candidates + listed:
            probe = copy.deepcopy(env)
            accepted = probe.step(action)[3]["action_is_valid"]
            assert accepted == (action in listed), (name, action, listed)
        _, _, done, _ = env.step(rng.choice(listed))
        if done:
            env.reset(rng.randrange(1000))


def test_an_env_with_a_missing_dependency_is_reported_unavailable(tmp_path, monkeypatch):
    (tmp_path / "needs_missing_dep.py").write_text("import not_a_real_package_for_grl\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(grl.envs._REGISTRY, "needs_missing", "needs_missing_dep:SomeEnv")
    status = grl.envs.available()
    assert "not_a_real_package_for_grl" in status["needs_missing"]
    assert status["sokoban"] is None  # the others are unaffected
    with pytest.raises(grl.envs.EnvUnavailable, match="needs_missing"):
        grl.envs.make("needs_missing")
