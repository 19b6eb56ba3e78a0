"""Bad inputs end `grl-train` with one line naming the key and exit status 2,
before Ray starts, leaving no file behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grl import train

REPO = Path(__file__).resolve().parents[1]


def base(tmp_path):
    return [
        "model_path=tiny",
        "trainer.device=cpu",
        f"trainer.run_dir={tmp_path}/run",
        f"trainer.default_local_dir={tmp_path}/ckpt",
    ]


@pytest.fixture
def blocked(tmp_path):
    """A file where a folder should be."""
    (tmp_path / "afile").write_text("x")
    return tmp_path


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """Teachers the tiny student cannot learn from: one with another tokenizer, one whose context is
    shorter than the run's."""
    import shutil

    from transformers import AutoConfig, AutoTokenizer

    from grl.models import tiny_model_path

    folder = tmp_path_factory.mktemp("teachers")
    for name in ("other_tokenizer", "short_context"):
        shutil.copytree(tiny_model_path(), folder / name)
    tokenizer = AutoTokenizer.from_pretrained(folder / "other_tokenizer")
    tokenizer.add_tokens(["<grl-not-the-student-s>"])
    tokenizer.save_pretrained(folder / "other_tokenizer")
    short = AutoConfig.from_pretrained(folder / "short_context")
    short.max_position_embeddings = 64
    short.save_pretrained(folder / "short_context")
    return folder


BAD = [  # (override, the key the message must name)
    ("total_training_steps=-5", "trainer.total_training_steps"),
    ("total_training_steps=0", "trainer.total_training_steps"),
    ("test_freq=-2", "trainer.test_freq"),
    ("save_freq=-3", "trainer.save_freq"),
    ("trainer.max_ckpt_to_keep=0", "trainer.max_ckpt_to_keep"),
    ("trainer.critic_warmup=-1", "trainer.critic_warmup"),
    ("actor_rollout_ref.actor.optim.lr=0", "actor_rollout_ref.actor.optim.lr"),
    ("actor_rollout_ref.actor.optim.lr=-1e-6", "actor_rollout_ref.actor.optim.lr"),
    ("critic.optim.lr=0", "critic.optim.lr"),
    ("actor_rollout_ref.actor.clip_ratio_low=1.5", "actor_rollout_ref.actor.clip_ratio_low"),
    ("actor_rollout_ref.actor.clip_ratio_high=0", "actor_rollout_ref.actor.clip_ratio_high"),
    ("actor_rollout_ref.actor.clip_ratio_c=0.5", "actor_rollout_ref.actor.clip_ratio_c"),
    ("actor_rollout_ref.actor.grad_clip=0", "actor_rollout_ref.actor.grad_clip"),
    ("actor_rollout_ref.actor.entropy_coeff=-0.1", "actor_rollout_ref.actor.entropy_coeff"),
    ("algorithm.gamma=1.5", "algorithm.gamma"),
    ("algorithm.lam=-0.1", "algorithm.lam"),
    ("actor_rollout_ref.rollout.top_p=0", "actor_rollout_ref.rollout.top_p"),
    ("actor_rollout_ref.rollout.temperature=-1", "actor_rollout_ref.rollout.temperature"),
    ("gpu_memory_utilization=1.5", "actor_rollout_ref.rollout.gpu_memory_utilization"),
    ("micro_batch_size_per_gpu=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("simpleSokobanAgent.agent_config.max_turns=0", "simpleSokobanAgent.agent_config.max_turns"),
    ("algorithm.adv_estimator=grpo rollout.agent_group_size=[1]", "rollout.agent_group_size"),
    ("max_prompt_length=8000", "max_prompt_length + max_response_length"),
    ("actor_rollout_ref.rollout.max_model_len=64", "actor_rollout_ref.rollout.max_model_len"),
    (
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
    ),
    ("model_path=/nonexistent/model", "actor_rollout_ref.model.path"),
    ("teacher.model_path=/nonexistent/teacher", "teacher.model_path: model path '/nonexistent/teacher'"),
    ("algorithm.adv_estimator=opd", "algorithm.adv_estimator=opd distils a teacher; set teacher.model_path"),
    ("teacher.url=http://127.0.0.1:9", "teacher.url: cannot reach http://127.0.0.1:9/v1/models"),
    (
        "teacher.url=http://127.0.0.1:9 actor_rollout_ref.rollout.temperature=0.7",
        "teacher.url: a served teacher returns log-probs of its plain softmax at temperature 1",
    ),
    (
        "teacher.model_path={teachers}/other_tokenizer",
        "teacher.model_path: '{teachers}/other_tokenizer' has another tokenizer",
    ),
    (
        "teacher.model_path={teachers}/short_context",
        "teacher.model_path: '{teachers}/short_context' holds 64 tokens",
    ),
    ("model_path={tmp}", "actor_rollout_ref.model.path"),  # a folder without config.json
    ("trainer.run_dir=/proc/grl/run", "trainer.run_dir"),  # unwritable even for root
    ("trainer.default_local_dir={tmp}/afile/ckpt", "trainer.default_local_dir"),
    ("trainer.ray_address=127.0.0.1:1", "trainer.ray_address"),
    (
        "rollout.validation=[birdAgent] rollout.validation_agent_group_num=[1] "
        "rollout.validation_agent_group_size=[1] birdAgent.env_config.dataset_path={tmp}/none.jsonl",
        "birdAgent",
    ),
    ("simpleSokobanAgent.env_config.dim_room=[2,2]", "simpleSokobanAgent"),
    ("trainer.resume_mode={tmp}", "trainer.resume_mode"),  # a folder that holds no checkpoint
    (
        "+prog.agent_type=program +prog.agent_config.program=no_such_module:play rollout.training=[prog] "
        "rollout.agent_group_num=[1] rollout.agent_group_size=[2]",
        "prog: program 'no_such_module:play': cannot import",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def no_ray_in_this_process():
    """Test modules before this one may have left a Ray runtime up in the pytest process; the checks
    here ask whether preflight started one, so they begin without."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


@pytest.mark.parametrize("override, key", BAD, ids=[b[0][:60] for b in BAD])
def test_bad_input_fails_in_preflight(override, key, blocked, teachers, capsys):
    before = sorted(p.relative_to(blocked) for p in blocked.rglob("*"))
    code = train.main([*base(blocked), *override.format(tmp=blocked, teachers=teachers).split()])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and key.format(tmp=blocked, teachers=teachers) in err, err
    assert sorted(p.relative_to(blocked) for p in blocked.rglob("*")) == before
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_wandb_online_without_key(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert train.main([*base(tmp_path), "trainer.logger=[console,wandb]"]) == 2
    assert "WANDB_API_KEY" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_offline_hub_id_not_cached(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert train.main([*base(tmp_path), "model_path=nobody/no-such-model"]) == 2
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err


def test_critic_free_estimator_builds_no_critic_and_preflight_only_reads(tmp_path):
    from omegaconf import OmegaConf

    from grl import preflight
    from grl.config import load_config, run_sections
    from grl.planner import plan

    cfg = load_config([*base(tmp_path), "algorithm.adv_estimator=grpo", "rollout.agent_group_size=[2]"])
    before = OmegaConf.to_yaml(cfg)
    notes = preflight.check(cfg)
    assert OmegaConf.to_yaml(cfg) == before
    assert cfg.critic.enable is True and any(
        n.startswith("critic.enable: grpo uses no critic") for n in notes
    )
    assert (
        "update_critic" not in plan(run_sections(cfg)).phases
    )  # the memory plan, like the trainer, reads the estimator
    assert list(tmp_path.iterdir()) == []


@pytest.mark.cpu_only
def test_bare_grl_train_without_cuda_points_at_the_cpu_preset(capsys):
    assert train.main([]) == 2
    assert "preset=cpu" in capsys.readouterr().err


@pytest.mark.cpu_only
@pytest.mark.parametrize(
    "asked, says",
    [
        (["trainer.device=cuda"], "grl-train: trainer.device: cuda, but this machine has no CUDA device;"),
        (
            ["preset=a100_1x_0.5b", "max_prompt_length=1024"],
            "grl-train: trainer.device: cuda (set by preset=a100_1x_0.5b), but this machine has no CUDA "
            "device;",
        ),
    ],
)
def test_a_gpu_run_without_cuda_is_refused_before_ray_naming_the_cpu_preset(asked, says, tmp_path, capsys):
    folders = [f"trainer.run_dir={tmp_path}/run", f"trainer.default_local_dir={tmp_path}/ckpt"]
    assert train.main(["model_path=tiny", *asked, *folders]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith(says) and "preset=cpu" in err, err
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    assert list(tmp_path.iterdir()) == []


def _run_processes(marker: str) -> list[int]:
    """Pids of processes whose environment carries `marker` (the driver, Ray, its workers)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


ASYNC = (
    "actor_rollout_ref.hybrid_engine=false",
    "rollout.max_staleness=1",
    "actor_rollout_ref.actor.recompute_old_log_probs=true",
    "actor_rollout_ref.actor.tis_imp_ratio_cap=2",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "wait_for, extra",
    [("step 1", ()), ("update_actor", ()), ("update_actor", ASYNC)],
    ids=["step 1", "update_actor", "update_actor with rollouts ahead"],
)
def test_sigterm_ends_every_process_of_the_run(tmp_path, wait_for, extra):
    marker = f"GRL_SIGTERM_TEST={tmp_path.name}"
    # A user's shell, not this pytest process's environment (earlier tests' in-process Ray runs leave
    # RAY_* settings in it that change how Ray's agents end).
    keep = {
        k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR") or k.startswith("GRL_")
    }
    env = {**keep, "PYTHONPATH": str(REPO), marker.split("=")[0]: marker.split("=")[1]}
    cmd = [
        sys.executable,
        "-m",
        "grl.train",
        "preset=cpu",
        "model_path=tiny",
        "max_response_length=8",
        "total_training_steps=50",
        "trainer.val_before_train=false",
        "test_freq=-1",
        "save_freq=-1",
        "trainer.export_hf=false",
        f"trainer.run_dir={tmp_path}/run",
        f"trainer.default_local_dir={tmp_path}/ck",
        *extra,
    ]
    log = tmp_path / "out.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.monotonic() + 240
        while wait_for not in log.read_text() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert driver.poll() is None, log.read_text()[-2000:]
        driver.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _run_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {pid: _cmdline(pid) for pid in _run_processes(marker)}
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"still running after 30 s: {left}\n{log.read_text()[-2000:]}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"
