"""The curriculum over puzzle difficulty: when it moves on, which stage a step plays, what it sets."""

import pytest

from grl.agents import make_agent
from grl.config import ConfigError, load_config, run_sections
from grl.envs import make
from grl.envs.solvers import solve_sokoban
from grl.rollout import task_specs
from grl.rollout.types import Episode
from grl.trainer.curriculum import Curriculum


def played(successes: list[float]) -> list[Episode]:
    return [
        Episode(task="t", group_id=0, seed=0, turns=[], score=s, metrics={"success": s}) for s in successes
    ]


def test_it_moves_on_when_the_window_mean_reaches_the_bar_and_stays_at_the_last_level():
    c = Curriculum("dim_x", [3, 4, 5], promote_at=0.5, window=2)
    steps = {1: [1, 1], 2: [0, 0], 3: [1, 0], 4: [1, 1], 5: [1, 1], 6: [1, 1], 7: [1, 1], 8: [1, 1]}
    moved = [c.record(step, played(s)) for step, s in steps.items()]
    # step 2: mean(1, 0) = 0.5 -> level 4; step 4: mean(0.5, 1) -> 5; then nothing is left to move to
    assert moved == [False, True, False, True, False, False, False, False]
    assert [c.stage_for(step) for step in range(1, 10)] == [0, 0, 1, 1, 2, 2, 2, 2, 2]
    # a rollout k steps ahead plays the stage reached k steps before
    assert [c.stage_for(step, max_staleness=1) for step in range(1, 10)] == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    again = Curriculum("dim_x", [3, 4, 5], 0.5, 2)
    again.load_state(c.state())
    assert again.state() == c.state() and again.stage_for(9) == 2


def test_a_stage_sets_the_env_key_of_every_training_task_and_the_env_plays_it():
    cfg = load_config(["preset=cpu", "rollout.curriculum.env_key=dim_x", "rollout.curriculum.levels=[3,4]"])
    c = Curriculum.from_config(cfg.rollout.curriculum)
    run = run_sections(cfg)
    specs = task_specs(run.rollout, run.tasks)
    easy = c.tasks(specs, 0)
    assert easy[0].config.env_config["dim_x"] == 3 and specs[0].config.env_config["dim_x"] == 4
    assert {k: v for k, v in easy[0].config.env_config.items() if k != "dim_x"} == {
        k: v for k, v in specs[0].config.env_config.items() if k != "dim_x"
    }
    env = make("tetris", **easy[0].config.env_config)
    board = env.reset(7)
    assert all(len(row) == 3 for row in env.board) and board
    assert Curriculum.from_config(load_config(["preset=cpu"]).rollout.curriculum) is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.curriculum.env_key=dim_x"], "rollout.curriculum.levels: name the values of dim_x"),
        (
            ["rollout.curriculum.env_key=width", "rollout.curriculum.levels=[3]"],
            "rollout.curriculum.env_key: env tetris of tetrisAgent_gap_dim_4 has no key 'width'",
        ),
        (
            [
                "rollout.curriculum.env_key=dim_x",
                "rollout.curriculum.levels=[3,4]",
                "rollout.curriculum.max_turns=[3]",
            ],
            "rollout.curriculum.max_turns: has 1 entries but rollout.curriculum.levels has 2",
        ),
        (
            [
                "rollout.curriculum.env_key=dim_x",
                "rollout.curriculum.levels=[3,4]",
                "rollout.curriculum.max_turns=[0,3]",
            ],
            "rollout.curriculum.max_turns",
        ),
    ],
)
def test_a_curriculum_the_tasks_cannot_play_stops_before_the_run(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["preset=cpu", *overrides])


def test_a_rollout_any_number_of_steps_ahead_finds_its_stage():
    c = Curriculum("dim_x", [3, 4], promote_at=1.0, window=1)
    for step in range(1, 1001):
        c.record(step, played([1.0 if step == 500 else 0.0]))
    assert c.stage_after == {1: 0, 500: 1}  # the changes, not a step-by-step history
    assert [c.stage_for(1001, max_staleness=k) for k in (0, 500, 501, 999)] == [1, 1, 0, 0]


def unsolving_move(observation: str) -> str:
    """A move that does not solve the puzzle now: any but the first of the solver's (any at all once a
    push has made it unsolvable)."""
    first = (solve_sokoban(observation) or [None])[0]
    return next(move for move in ("Up", "Down", "Left", "Right") if move != first)


def test_each_stage_ends_a_failing_training_episode_at_its_own_turn_budget():
    cfg = load_config(
        ["preset=sokoban_cpu", "rollout.curriculum.levels=[1,1]", "rollout.curriculum.max_turns=[3,5]"]
    )
    c = Curriculum.from_config(cfg.rollout.curriculum)
    run = run_sections(cfg)
    specs = task_specs(run.rollout, run.tasks)
    for stage, budget in enumerate([3, 5]):
        (spec,) = c.tasks(specs, stage)
        agent = make_agent(spec.name, spec.config)
        agent.reset(11)
        turns = 0
        while True:
            turns += 1
            step = agent.step(f"<answer>{unsolving_move(agent.observation)}</answer>")
            if step.done:
                break
        assert turns == budget and not agent.episode_metrics()["success"]
    # the budget text still counts the task's actions: a stage's episode reads as validation's first turns
    assert specs[0].config.agent_config.max_turns == 10 and "10 actions left" in agent.messages[1]["content"]
    # without the key the tasks keep their own max_turns
    plain = Curriculum("solution_moves", [1, 2], promote_at=0.6, window=2)
    assert plain.tasks(specs, 1)[0].config.agent_config == specs[0].config.agent_config
