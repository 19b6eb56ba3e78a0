"""Launch scripts: positional arguments map to the right Hydra keys, the command they would run is a
valid config, `source` leaves the caller's shell as it was, `--help` lists the arguments and starts
nothing, and a bad argument stops the script in one line that names it."""

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from grl.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["quick_train_qwen_halfb.sh", "verl_quick_training_example.sh"] + [
    f"examples/{task}_ppo/qwen_{size}.sh" for task in ("sokoban", "tetris") for size in ("halfb", "3b", "7b")
]


def dry_run(script: str, *args: str, force_gpu: bool = False) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "HOME": str(Path.home())}
    if force_gpu:
        env["GRL_FORCE_GPU"] = "1"
    out = subprocess.run(
        ["bash", script, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    command_line = out.stdout.strip().splitlines()[-1]
    argv = shlex.split(command_line)
    assert argv[1:3] == ["-m", "grl.train"], command_line
    return argv[3:]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_builds_a_valid_command_on_gpu_and_cpu(script):
    for force_gpu in (True, False):
        overrides = dry_run(script, force_gpu=force_gpu)
        overrides = [o for o in overrides if not o.startswith("model_path=Qwen")]  # no hub here
        load_config(overrides)


def test_positional_arguments_map_in_order_with_memory_fraction(tmp_path):
    overrides = dry_run(
        "examples/sokoban_ppo/qwen_3b.sh",
        "0,1",
        "4,2",
        "8",
        "16,8",
        "1,2",
        "simpleSokobanAgent,largeSokobanAgent",
        "simpleSokobanAgent,gsm8kAgent_single_turn",
        "2",
        "proj",
        "exp",
        str(tmp_path),
        "0.3",
        "17",
        "trainer.test_freq=3",
        force_gpu=True,
    )
    assert overrides == [
        f"model_path={tmp_path}",
        "rollout.agent_group_num=[4,2]",
        "rollout.agent_group_size=[8]",
        "rollout.validation_agent_group_num=[16,8]",
        "rollout.validation_agent_group_size=[1,2]",
        "rollout.training=[simpleSokobanAgent,largeSokobanAgent]",
        "rollout.validation=[simpleSokobanAgent,gsm8kAgent_single_turn]",
        "n_gpus_per_node=2",
        "project_name=proj",
        "experiment_name=exp",
        "total_training_steps=17",
        "gpu_memory_utilization=0.3",
        "trainer.test_freq=3",
    ]


def test_halfb_scripts_take_steps_twelfth_and_empty_arguments_keep_defaults():
    overrides = dry_run(
        "examples/tetris_ppo/qwen_halfb.sh", "", "", "", "", "", "", "", "", "", "", "", "9", force_gpu=True
    )
    assert "total_training_steps=9" in overrides
    assert "rollout.training=[tetrisAgent_type_1_dim_4]" in overrides
    assert "preset=a100_1x_0.5b" in overrides


def test_cpu_fallback_uses_the_cpu_preset_and_keeps_explicit_arguments():
    overrides = dry_run("examples/sokoban_ppo/qwen_7b.sh", "0", "3", "2")
    assert overrides[:2] == ["preset=cpu", "model_path=embedded"]
    assert "rollout.agent_group_num=[3]" in overrides and "rollout.agent_group_size=[2]" in overrides
    assert not any(o.startswith("n_gpus_per_node") for o in overrides)


def test_source_leaves_the_callers_shell_unchanged(tmp_path):
    script = f"""
        cd {tmp_path}
        set +e +u
        before_opts="$(set +o)"; before_dir="$PWD"
        DRY_RUN=1 source {ROOT}/examples/sokoban_ppo/qwen_halfb.sh 0 2 >/dev/null
        status=$?
        [ "$(set +o)" = "$before_opts" ] || {{ echo "options changed"; exit 1; }}
        [ "$PWD" = "$before_dir" ] || {{ echo "directory changed"; exit 1; }}
        type grl_launch >/dev/null 2>&1 && {{ echo "function leaked"; exit 1; }}
        [ -z "${{GRL_DEFAULTS+x}}" ] || {{ echo "variable leaked"; exit 1; }}
        echo "ok $status"
    """
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok 0", out.stdout + out.stderr


def test_grl_script_name_runs_the_quick_start():
    assert dry_run("verl_quick_training_example.sh", "0", "3") == dry_run(
        "quick_train_qwen_halfb.sh", "0", "3"
    )


def dry_run_output(script: str, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "HOME": str(Path.home())}
    out = subprocess.run(
        ["bash", script, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cpu_fallback_names_the_arguments_it_does_not_use():
    out = dry_run_output(
        "examples/sokoban_ppo/qwen_3b.sh", "0", "3", "", "", "", "", "", "2", "", "", "/models/x", "0.3"
    )
    assert (
        "does not use these arguments you gave: cuda_devices=0 n_gpus=2 model_path=/models/x mem_fraction=0.3"
        in out
    )
    assert "group_num       3\n" in out  # used: no note


# GPU: the script's per-task default (GRL's); CPU: the CPU preset's validation group count.
@pytest.mark.parametrize("force_gpu, per_task", [(True, "256"), (False, "64")])
def test_only_validation_tasks_adjusts_the_validation_groups(force_gpu, per_task):
    overrides = dry_run(
        "examples/sokoban_ppo/qwen_3b.sh",
        "",
        "",
        "",
        "",
        "",
        "",
        "simpleSokobanAgent,gsm8kAgent_single_turn",
        force_gpu=force_gpu,
    )
    assert f"rollout.validation_agent_group_num=[{per_task},{per_task}]" in overrides
    assert "rollout.validation_agent_group_size=[1,1]" in overrides
    load_config([o for o in overrides if not o.startswith("model_path=Qwen")])


def test_source_without_arguments_ignores_the_callers_parameters():
    script = f"""
        set -- 7 9 9 9 9 nosuchTask
        DRY_RUN=1 source {ROOT}/examples/sokoban_ppo/qwen_halfb.sh | tail -1
        DRY_RUN=1 source {ROOT}/examples/sokoban_ppo/qwen_halfb.sh 0 3 | tail -1
    """
    out = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    plain, with_args = out.stdout.strip().splitlines()
    assert "nosuchTask" not in plain and "agent_group_num" not in plain
    assert "rollout.agent_group_num=\\[3\\]" in with_args


POSITIONAL = [
    "cuda_devices",
    "group_num",
    "group_size",
    "val_group_num",
    "val_group_size",
    "train_tasks",
    "val_tasks",
]
POSITIONAL += ["n_gpus", "project", "experiment", "model_path"]


def copy_of_the_scripts(tmp_path) -> tuple[Path, Path]:
    """The launch scripts and configs in a tree of their own, without .venv, and a `python` on PATH that
    only records that it was started."""
    for script in SCRIPTS:
        (tmp_path / script).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / script, tmp_path / script)
    shutil.copy(ROOT / "examples" / "launch_common.sh", tmp_path / "examples")
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    bin_dir, started = tmp_path / "bin", tmp_path / "started"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$@" >> {started}\n')
    (bin_dir / "python").chmod(0o755)
    return bin_dir, started


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_every_argument_with_its_default_and_starts_nothing(script, tmp_path):
    bin_dir, started = copy_of_the_scripts(tmp_path)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(Path.home()), "GRL_FORCE_GPU": "1"}
    with_mem = "qwen_3b" in script or "qwen_7b" in script
    names = POSITIONAL + (["mem_fraction"] if with_mem else []) + ["total_steps"]
    for flag, position in (("--help", 0), ("-h", 0), ("--help", 3)):
        args = ["0"] * position + [flag]
        out = subprocess.run(
            ["bash", script, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0 and out.stderr == "", out.stderr
        assert not started.exists() and not (tmp_path / "logs").exists(), out.stdout
        lines = out.stdout.splitlines()
        assert lines[0].startswith("Usage: bash ") and "Example" in out.stdout
        listed = [line.split()[1] for line in lines if line[:4].strip().isdigit()]
        assert listed == names, listed
        defaults = [line.split("default: ", 1)[1] for line in lines if "default: " in line]
        assert len(defaults) == len(names) and defaults[-1] == "200"
    # the same tree runs the command when asked to: the fake python is what `--help` did not start
    subprocess.run(["bash", script], cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert "-m grl.train" in started.read_text()


BAD_ARGUMENTS = [
    (
        "quick_train_qwen_halfb.sh",
        ["--hlep"],
        "argument 1 (cuda_devices): '--hlep' is not a comma list of GPU indices",
    ),
    ("examples/sokoban_ppo/qwen_halfb.sh", ["0", "8,x"], "argument 2 (group_num): '8,x' is not a comma list"),
    (
        "examples/sokoban_ppo/qwen_halfb.sh",
        ["0", "", "0"],
        "argument 3 (group_size): '0' is not a comma list",
    ),
    (
        "examples/tetris_ppo/qwen_3b.sh",
        ["", "", "", "", "", "tetrisAgent"],
        "argument 6 (train_tasks): 'tetrisAgent' is not a task",
    ),
    (
        "examples/tetris_ppo/qwen_3b.sh",
        [""] * 6 + ["simpleSokobanAgent,nope"],
        "argument 7 (val_tasks): 'nope' is not a task",
    ),
    (
        "examples/sokoban_ppo/qwen_7b.sh",
        [""] * 7 + ["eight"],
        "argument 8 (n_gpus): 'eight' is not a positive whole number",
    ),
    (
        "examples/sokoban_ppo/qwen_7b.sh",
        [""] * 9 + ["my run"],
        "argument 10 (experiment): 'my run' is not a name",
    ),
    # argument 11 left out: the memory fraction lands on the model, the steps on the fraction
    (
        "examples/sokoban_ppo/qwen_3b.sh",
        [""] * 10 + ["0.5", "200"],
        "argument 11 (model_path): '0.5' is neither a hub id",
    ),
    (
        "examples/sokoban_ppo/qwen_3b.sh",
        [""] * 11 + ["200"],
        "argument 12 (mem_fraction): '200' is not a fraction in (0, 1]",
    ),
    (
        "examples/sokoban_ppo/qwen_3b.sh",
        [""] * 11 + ["0"],
        "argument 12 (mem_fraction): '0' is not a fraction",
    ),
    (
        "examples/sokoban_ppo/qwen_halfb.sh",
        [""] * 11 + ["0.5", "200"],
        "argument 12 (total_steps): '0.5' is not a positive",
    ),
    (
        "examples/sokoban_ppo/qwen_halfb.sh",
        [""] * 12 + ["200"],
        "argument 13 (override): '200' is not KEY=VALUE",
    ),
    (
        "verl_quick_training_example.sh",
        [""] * 11 + ["-3"],
        "argument 12 (total_steps): '-3' is not a positive",
    ),
]


@pytest.mark.parametrize("script, args, message", BAD_ARGUMENTS)
def test_a_bad_argument_stops_the_script_in_one_line_naming_it(script, args, message):
    env = {"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "HOME": str(Path.home())}
    out = subprocess.run(
        ["bash", script, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stdout
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"grl: {message}"), out.stderr
    assert "would run" not in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["0"], "argument 8 (n_gpus): 2 GPUs per node, but argument 1 (cuda_devices) '0' names 1"),
        (
            [""] * 10 + ["/no/such/model"],
            "argument 11 (model_path): '/no/such/model' is not a folder on this machine",
        ),
    ],
)
def test_what_only_the_gpu_command_uses_is_checked_there(args, message):
    env = {"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "HOME": str(Path.home())}
    gpu = subprocess.run(
        ["bash", "examples/sokoban_ppo/qwen_3b.sh", *args],
        cwd=ROOT,
        env={**env, "GRL_FORCE_GPU": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gpu.returncode == 2 and gpu.stderr.startswith(f"grl: {message}"), gpu.stderr
    cpu = subprocess.run(
        ["bash", "examples/sokoban_ppo/qwen_3b.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert cpu.returncode == 0 and "does not use these arguments you gave" in cpu.stdout, cpu.stderr
