"""The env contract, checked on every env that needs no dataset: any string is a valid input to `step`
(never a crash), `info` carries the contract's keys, an invalid action leaves the state as it was, and
the same seed gives the same episode."""

import random

import pytest

import grl.envs

SELF_CONTAINED = ["sokoban", "tetris", "blocksworld", "guess_number", "textworld"]
ALPHABET = "UpDownLeftRightmove to 0123456789()[]\n\t .,;:|/\\\"'<>√é漢\x00\u202e"


@pytest.mark.parametrize("name", SELF_CONTAINED)
def test_arbitrary_strings_never_crash(name):
    rng = random.Random(3)
    env = grl.envs.make(name)
    start = env.reset(0)
    for _ in range(300):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40)))
        obs, reward, done, info = env.step(text)
        assert isinstance(obs, str) and isinstance(reward, float) and isinstance(done, bool)
        assert set(info) >= {"success", "action_is_valid", "action_is_effective"}
        if not info["action_is_valid"]:
            assert start in obs or done  # the state is unchanged (an env may prepend an error note)
        else:
            start = obs
        if done:
            start = env.reset(0)


@pytest.mark.parametrize("name", SELF_CONTAINED)
def test_same_seed_same_episode(name):
    first, second = grl.envs.make(name), grl.envs.make(name)
    assert first.reset(7) == second.reset(7)
    rng = random.Random(0)
    for _ in range(20):
        action = rng.choice(["Up", "Down", "Left", "Right", "move 1 to 0", "move 2 to 1", "50", "7"])
        assert first.step(action) == second.step(action)


def test_an_env_with_a_missing_dependency_is_reported_unavailable(tmp_path, monkeypatch):
    (tmp_path / "needs_missing_dep.py").write_text("import not_a_real_package_for_grl\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(grl.envs._REGISTRY, "needs_missing", "needs_missing_dep:SomeEnv")
    status = grl.envs.available()
    assert "not_a_real_package_for_grl" in status["needs_missing"]
    assert status["sokoban"] is None  # the others are unaffected
    with pytest.raises(grl.envs.EnvUnavailable, match="needs_missing"):
        grl.envs.make("needs_missing")
