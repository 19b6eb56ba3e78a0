"""GRL against Hugging Face TRL's GRPOTrainer: one GRPO job, both trainers, the same cores.

    .venv/bin/python bench/bench_vs_trl.py [--job gsm8k|tetris] [--steps 3] [--prompts 2] [--generations 4]
                                           [--data DIR] [--rounds 1]

Two jobs, both for the embedded SmolLM2-135M-Instruct:
- `gsm8k` (default): GSM8K single-turn (`gsm8kAgent_single_turn`) from a local JSONL folder (`--data`,
  default /work/shared/data/gsm8k, else data/gsm8k).
- `tetris`: the multi-turn game of the CPU preset (`tetrisAgent_gap_dim_4`: move a piece Left or Right over
  the gap, then Down; up to 5 turns), decoded freely on both sides (TRL has no valid-action decoding). TRL
  plays it through its experimental `rollout_func`: turn by turn, every episode still playing gets its next
  reply from one `generate` call over the whole conversation so far, GRL's agent steps the game, and the
  episode's tokens are the first prompt, then each reply (env_mask 1) and the template and game tokens
  between replies (env_mask 0), built with GRL's own grl.rollout.chat.ChatTokens, so both systems train on
  the same token sequence. GRL's hf engine keeps each episode's KV cache between turns; TRL recomputes the
  conversation each turn (it has no such cache).
GRL runs first (`grl-train` with overrides, hf engine, CPU), then TRL (`GRPOTrainer`, `use_vllm=False`, CPU),
one after the other, each with OMP_NUM_THREADS = the machine's cores. Both see the same questions or games in
the same order: GRL's group g of step s plays seed `s * 100003 + g`; TRL's dataset lists those seeds in that
order and is not shuffled. Both build the prompts and the rewards with GRL's own agent (grl.agents.make_agent:
system prompt + task prompt + question or board; GSM8K: 10 for the right number, -0.1 for a wrong one, -0.1
more without <answer> tags; the game: 10 for the row its piece completes (a win), -0.1 for a reply without
a valid move, summed over the episode's turns), so the reward curves are comparable number for number.

TRL lives in its own virtual environment, .bench-venvs/trl (gitignored), which this script builds on
first use: the CPU torch 2.13.0 first (the local wheel in /opt/wheels when there is one), so that
nothing pulls a CUDA torch, then trl==1.16.* with the transformers it asks for (and omegaconf, which GRL's
agent code reads). When that environment cannot be built the script says so in one line and exits 0. No
test imports TRL.

Settings, GRL key <-> TRL GRPOConfig field (read from trl 1.16.0's grpo_config.py / grpo_trainer.py):
  rollout.agent_group_num=[P]            <-> P prompts a step: per_device_train_batch_size = P * G,
  rollout.agent_group_size=[G]               num_generations = G, gradient_accumulation_steps = 1,
                                             steps_per_generation = 1 (one generation batch per step)
  ppo_mini_batch_size = P * G             <-> one optimizer step per generation batch (as above)
  micro_batch_size_per_gpu = P * G        <-> per_device_train_batch_size: one forward/backward
  max_response_length, agent max_tokens   <-> max_completion_length (tetris: the limit of each reply,
                                             `max_new_tokens` of each turn's generate call)
  actor.optim.lr, betas (0.9, 0.999),     <-> learning_rate, adam_beta1/2, weight_decay=0.01,
    weight_decay 0.01, constant lr            lr_scheduler_type="constant", optim="adamw_torch"
  actor.grad_clip 1.0                     <-> max_grad_norm 1.0
  actor.ppo_epochs 1                      <-> num_iterations 1
  actor.clip_ratio_low/high 0.2/0.28      <-> epsilon 0.2, epsilon_high 0.28
  actor.loss_agg_mode token-mean          <-> loss_type "dapo" (sum over all tokens of the batch /
                                             their number)
  actor.use_kl_loss false, no KL reward   <-> beta 0.0 (TRL then loads no reference model)
  actor.entropy_coeff 0                   <-> (TRL has no entropy bonus)
  algorithm.adv_estimator grpo,           <-> scale_rewards "group" ((r - group mean) / group std)
    norm_adv_by_std_in_grpo true
  rollout.temperature 1.0, top_p 1, top_k -1 <-> temperature 1.0, top_p 1.0, top_k 0
  model.dtype auto (grl.compute.cpu_compute) <-> bf16 by the same rule, fp16=False (fp32 weights; bf16
                                             compute where the CPU has it natively, else fp32)
  model.enable_gradient_checkpointing true <-> gradient_checkpointing True (both systems' default)
  rollout_filter_ratio 1.0 (keep all)     <-> (TRL keeps all)
  rollout.packing true (share_prompts)    <-> (TRL pads the batch and runs each completion with its
                                             prompt: G copies of a prompt, where GRL runs it once)
  critic.enable false                     <-> (TRL has none)
Phases: GRL's timing_s/gen (generation and env scoring), old_log_prob + ref (scoring forward passes),
adv, update_actor, sync_weights (engine weight refresh); TRL's `_generate` (generation),
`_calculate_rewards` (rewards), the rest of `_generate_and_score_completions` (its scoring pass), and
the rest of the optimizer step (update). Peak memory is the largest summed RSS of the process tree
(GRL's Ray workers included), sampled every 0.2 s.

The tetris job: TRL's `_generate` (its `rollout_func`: generation and the game's steps) is "gen+reward";
no logprobs are returned from the rollout (TRL without vLLM computes none either: it uses the update's own
log-probs as the old ones when num_iterations is 1).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".bench-venvs" / "trl"
TORCH_WHEEL_DIR = Path("/opt/wheels")


@dataclass(frozen=True)
class Job:
    task: str  # a task instance of configs/agents.yaml
    max_completion: int  # tokens of a reply (each turn's, in a game)
    max_prompt: int  # GRL's max_prompt_length: the whole conversation before a reply
    agent_config: dict = field(default_factory=dict)  # overrides of the task's agent_config, both sides
    uses_data: bool = False  # the task reads --data (env_config.data_path)
    multi_turn: bool = False  # TRL plays it through its rollout_func


JOBS = {
    "gsm8k": Job("gsm8kAgent_single_turn", max_completion=64, max_prompt=320, uses_data=True),
    "tetris": Job(
        "tetrisAgent_gap_dim_4",
        max_completion=16,
        max_prompt=1024,
        agent_config={"action_decoding": "free"},
        multi_turn=True,
    ),
}


# ------------------------------------------------------------------ measuring a process tree


def _tree(root: int) -> dict[int, tuple[int, float]]:
    """pid -> (RSS bytes, CPU seconds so far) of `root` and its descendants."""
    children: dict[int, list[int]] = {}
    usage: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        usage[int(entry)] = (rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in usage:
            tree[pid] = usage[pid]
        todo += children.get(pid, [])
    return tree


def run_measured(cmd: list[str], env: dict, log: Path) -> tuple[int, float, float, float]:
    """Run `cmd`, its output to `log`; return (exit code, wall seconds, peak tree RSS in GiB, tree CPU
    seconds). CPU seconds are what the run cost whatever else shares the cores; wall time is not."""
    peak, cpu, start = 0, {}, time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample():
            nonlocal peak
            while not done.wait(0.2):
                tree = _tree(proc.pid)
                peak = max(peak, sum(rss for rss, _ in tree.values()))
                cpu.update({pid: seconds for pid, (_, seconds) in tree.items()})

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait()
        done.set()
        sampler.join()
    return code, time.perf_counter() - start, peak / 2**30, sum(cpu.values())


# ------------------------------------------------------------------ the TRL environment


def trl_python() -> Path | None:
    """The TRL venv's python, building the venv on first use; None (after one line) when it cannot be
    built."""
    python = VENV / "bin" / "python"
    if (
        python.exists()
        and subprocess.run([python, "-c", "import trl, omegaconf"], capture_output=True).returncode == 0
    ):
        return python
    wheels = sorted(TORCH_WHEEL_DIR.glob("torch-2.13.0*cpu*.whl")) if TORCH_WHEEL_DIR.is_dir() else []
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [python, "-m", "pip", "install", "-q", str(wheels[0]) if wheels else "torch==2.13.0"],
        # omegaconf: GRL's agent code, which prompts and scores for TRL too, reads its config schema
        [python, "-m", "pip", "install", "-q", "trl==1.16.*", "omegaconf==2.3.1"],
    ]
    print(
        f"bench_vs_trl: building {VENV.relative_to(REPO)} (torch 2.13.0 CPU, then trl 1.16) ...", flush=True
    )
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True)
        if result.returncode != 0:
            why = (result.stderr.strip().splitlines() or ["no output"])[-1]
            print(
                f"bench_vs_trl: skipped: cannot build the TRL environment ({' '.join(map(str, step[:4]))}): "
                f"{why}"
            )
            return None
    return python


# ------------------------------------------------------------------ the job, both ways


def seeds(steps: int, prompts: int) -> list[int]:
    """The seeds GRL's training groups play (rollout.seed: step s, group g -> s * 100003 + g)."""
    return [s * 100003 + g for s in range(steps) for g in range(prompts)]


def task_overrides(job: Job, args) -> dict[str, object]:
    """The job's changes to its task block, as dotted keys under it; the same for both sides."""
    overrides = {f"agent_config.{k}": v for k, v in job.agent_config.items()}
    overrides["agent_config.max_tokens"] = args.max_completion
    if job.uses_data:
        overrides["env_config.data_path"] = args.data
    return overrides


def task_config(job: Job, args) -> dict:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(REPO / "configs" / "agents.yaml")[job.task]
    for key, value in task_overrides(job, args).items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_container(cfg, resolve=False)


def run_grl(args, workdir: Path, env: dict) -> dict:
    job = JOBS[args.job]
    batch = args.prompts * args.generations
    cmd = [
        str(REPO / ".venv" / "bin" / "grl-train"),
        "model_path=embedded",
        f"rollout.training=[{job.task}]",
        f"rollout.validation=[{job.task}]",
        f"rollout.agent_group_num=[{args.prompts}]",
        f"rollout.agent_group_size=[{args.generations}]",
        "rollout.validation_agent_group_num=[1]",
        "rollout.seed=0",
        "rollout.rollout_filter_ratio=1.0",
        "rollout.packing=true",
        "trainer.val_before_train=false",
        "test_freq=-1",
        "trainer.export_hf=false",
        "resume_mode=disable",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        "critic.enable=false",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.device=cpu",
        "actor_rollout_ref.model.dtype=auto",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        f"max_response_length={args.max_completion}",
        f"max_prompt_length={args.max_prompt}",
        *(f"{job.task}.{key}={value}" for key, value in task_overrides(job, args).items()),
        f"ppo_mini_batch_size={batch}",
        f"micro_batch_size_per_gpu={batch}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        f"total_training_steps={args.steps}",
        "trainer.logger=[jsonl]",
        f"trainer.run_dir={workdir / 'grl'}",
        f"trainer.default_local_dir={workdir / 'grl_ckpt'}",
    ]
    # Ray's raylet starts workers at nice 15 (its worker_niceness); on shared cores that alone would
    # hand TRL, at nice 0, the larger share. Both run at nice 0 here.
    code, wall, peak, cpu = run_measured(cmd, {**env, "RAY_worker_niceness": "0"}, workdir / "grl.log")
    if code != 0:
        sys.exit(f"bench_vs_trl: grl-train failed (exit {code}); see {workdir / 'grl.log'}")
    rows = [json.loads(line) for line in open(workdir / "grl" / "metrics.jsonl") if line.strip()]
    rows = [r for r in rows if "timing_s/step" in r]
    t = lambda r, *keys: sum(r.get(f"timing_s/{k}", 0.0) for k in keys)  # noqa: E731
    return {
        "wall_s": wall,
        "peak_gib": peak,
        "cpu_s": cpu,
        "steps": [
            {
                "gen": t(r, "gen"),
                "score": t(r, "old_log_prob", "ref", "adv"),
                "update": t(r, "update_actor", "sync_weights"),
                "step": t(r, "step"),
                "reward": r.get("reward/mean", r.get("critic/score/mean")),
            }
            for r in rows
        ],
    }


def run_trl(args, python: Path, workdir: Path, env: dict) -> dict:
    spec = {
        "steps": args.steps,
        "prompts": args.prompts,
        "generations": args.generations,
        "max_completion": args.max_completion,
        "lr": args.lr,
        "seeds": seeds(args.steps, args.prompts),
        "task_name": JOBS[args.job].task,
        "task": task_config(JOBS[args.job], args),
        "multi_turn": JOBS[args.job].multi_turn,
        "out": str(workdir / "trl.json"),
        "model": str(model_path()),
    }
    (workdir / "trl_spec.json").write_text(json.dumps(spec))
    cmd = [str(python), str(Path(__file__).resolve()), "--trl-worker", str(workdir / "trl_spec.json")]
    code, wall, peak, cpu = run_measured(cmd, {**env, "TRL_EXPERIMENTAL_SILENCE": "1"}, workdir / "trl.log")
    if code != 0:
        sys.exit(f"bench_vs_trl: the TRL run failed (exit {code}); see {workdir / 'trl.log'}")
    return {"wall_s": wall, "peak_gib": peak, "cpu_s": cpu, **json.loads((workdir / "trl.json").read_text())}


def model_path() -> Path:
    from grl.models import resolve_model_path

    return Path(resolve_model_path("embedded"))


# ------------------------------------------------------------------ TRL side (runs in the TRL venv)


def game_rollout(spec: dict, tokenizer):
    """TRL's `rollout_func` for a multi-turn task: the episodes of one generation batch, played turn by
    turn with the trainer's model the way TRL's own generation calls it, GRL's agents stepping the game.
    TRL passes the batch's prompts, each repeated num_generations times in dataset order (not shuffled),
    so the k-th call plays seeds[k * P:(k + 1) * P]; each prompt is checked against its seed's reset."""
    import torch
    from trl.models import unwrap_model_for_generation

    from grl.agents import make_agent
    from grl.rollout.chat import ChatTokens

    chat = ChatTokens(tokenizer)
    batch = spec["prompts"] * spec["generations"]
    agents = [make_agent(spec["task_name"], spec["task"]) for _ in range(batch)]
    seeds = iter([seed for seed in spec["seeds"] for _ in range(spec["generations"])])

    def rollout(prompts, trainer):
        if len(prompts) != batch:
            raise ValueError(f"rollout_func got {len(prompts)} prompts, expected {batch}")
        prompt_ids = []
        for agent, prompt in zip(agents, prompts):
            messages = agent.reset(next(seeds))
            if messages != prompt:
                raise RuntimeError("rollout_func: TRL's prompts are not the seeds' games in order")
            prompt_ids.append(chat.first_prompt(messages))
        completion_ids = [[] for _ in prompts]
        env_mask = [[] for _ in prompts]
        rewards = [0.0] * batch
        playing = list(range(batch))
        generation = copy.deepcopy(trainer.generation_config)
        generation.max_new_tokens = spec["max_completion"]
        for turn in range(max(agent.max_turns for agent in agents)):
            if not playing:
                break
            contexts = [torch.tensor(prompt_ids[i] + completion_ids[i]) for i in playing]
            width = max(len(c) for c in contexts)
            input_ids = torch.full((len(contexts), width), tokenizer.pad_token_id)
            attention_mask = torch.zeros((len(contexts), width), dtype=torch.long)
            for row, context in enumerate(contexts):  # left padding, as TRL's generation pads
                input_ids[row, width - len(context) :] = context
                attention_mask[row, width - len(context) :] = 1
            with (
                unwrap_model_for_generation(
                    trainer.model_wrapped,
                    trainer.accelerator,
                    generation_kwargs=trainer.generation_kwargs,
                    gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
                ) as model,
                torch.no_grad(),
            ):
                output = model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=generation
                )
            still = []
            for row, i in enumerate(playing):
                reply = output[row, width:].tolist()
                ends = [k for k, token in enumerate(reply) if token in trainer.eos_token_ids]
                reply = reply[: ends[0] + 1] if ends else reply
                completion_ids[i] += reply
                env_mask[i] += [1] * len(reply)
                step = agents[i].step(tokenizer.decode(reply, skip_special_tokens=True))
                rewards[i] += step.reward
                if step.done or turn + 1 >= agents[i].max_turns:
                    continue
                between = chat.turn_delta(agents[i].messages, reply[-1] if reply else None)
                completion_ids[i] += between
                env_mask[i] += [0] * len(between)
                still.append(i)
            playing = still
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": None,
            "env_mask": env_mask,
            "episode_reward": rewards,
        }

    return rollout


def trl_worker(spec_file: str) -> None:
    """One GRPOTrainer run as the spec says; writes per-step phase times and rewards to spec['out']."""
    sys.path.insert(0, str(REPO))  # GRL's agents (pure Python) build the prompts and score the replies
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grl.agents import make_agent
    from grl.compute import cpu_compute

    spec = json.loads(Path(spec_file).read_text())
    agent = make_agent(spec["task_name"], spec["task"])
    rows = [{"prompt": agent.reset(seed), "seed": seed} for seed in spec["seeds"]]
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])

    def one_reply_reward(prompts, completions, seed, **_):
        rewards = []
        for completion, episode_seed in zip(completions, seed):
            agent.reset(episode_seed)
            rewards.append(agent.step(completion[-1]["content"]).reward)
        return rewards

    def episode_reward(prompts, completions, episode_reward, **_):
        return episode_reward

    batch = spec["prompts"] * spec["generations"]
    config = GRPOConfig(
        output_dir=str(Path(spec["out"]).parent / "trl_out"),
        max_steps=spec["steps"],
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        seed=0,
        use_cpu=True,
        bf16=cpu_compute().native_bf16,
        fp16=False,
        use_vllm=False,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=spec["generations"],
        max_completion_length=spec["max_completion"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        weight_decay=0.01,
        max_grad_norm=1.0,
        num_iterations=1,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        beta=0.0,
        scale_rewards="group",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        gradient_checkpointing=True,
        shuffle_dataset=False,
        dataloader_num_workers=0,
    )
    multi_turn = spec["multi_turn"]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=episode_reward if multi_turn else one_reply_reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        rollout_func=game_rollout(spec, tokenizer) if multi_turn else None,
    )

    phases: dict[str, float] = {}

    def timed(name, method):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - start

        return wrapper

    trainer._generate = timed("gen", trainer._generate)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed("rollout", trainer._generate_and_score_completions)
    steps: list[dict] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *_, **__):
            phases.clear()
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            total = time.perf_counter() - self.start
            gen = phases.get("gen", 0.0)
            steps.append(
                {
                    "gen": gen + phases.get("reward", 0.0),
                    "score": phases.get("rollout", 0.0) - gen - phases.get("reward", 0.0),
                    "update": total - phases.get("rollout", 0.0),
                    "step": total,
                }
            )

    trainer.add_callback(StepTimes())
    trainer.train()
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    for step, reward in zip(steps, rewards):
        step["reward"] = reward
    import transformers
    import trl

    Path(spec["out"]).write_text(
        json.dumps(
            {
                "steps": steps,
                "versions": {
                    "trl": trl.__version__,
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                },
            }
        )
    )


# ------------------------------------------------------------------ report


def summary(name: str, run: dict, episodes_per_step: int) -> dict:
    steps = run["steps"]
    timed = steps[1:] or steps  # the first step pays one-off warm-up (allocator, kernels) in both systems
    # The median step: on shared cores one step now and then stalls behind someone else's job.
    median_step = sorted(timed, key=lambda s: s["step"])[(len(timed) - 1) // 2]
    row = {k: median_step[k] for k in ("gen", "score", "update", "step")}
    row["episodes_per_hour"] = 3600 * episodes_per_step / row["step"]
    row["wall_episodes_per_hour"] = 3600 * episodes_per_step * len(steps) / run["wall_s"]
    row["cpu_s"] = run["cpu_s"]
    print(
        f"{name:>4}: steps {' '.join(format(s['step'], '.0f') for s in steps)}s; median after the first "
        f"{row['step']:.1f}s = gen+reward {row['gen']:6.1f}s, scoring {row['score']:6.1f}s, "
        f"update {row['update']:6.1f}s | {row['episodes_per_hour']:6.0f} episodes/h (steps), "
        f"{row['wall_episodes_per_hour']:6.0f} episodes/h (wall {run['wall_s']:.0f}s, CPU "
        f"{run['cpu_s']:.0f}s) "
        f"| peak {run['peak_gib']:.2f} GiB"
        f" | reward {' '.join('-' if s['reward'] is None else format(s['reward'], '.2f') for s in steps)}"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_data = (
        "/work/shared/data/gsm8k" if Path("/work/shared/data/gsm8k").is_dir() else str(REPO / "data/gsm8k")
    )
    parser.add_argument(
        "--job",
        choices=sorted(JOBS),
        default="gsm8k",
        help="gsm8k: single-turn questions; tetris: the CPU preset's multi-turn game",
    )
    parser.add_argument("--data", default=default_data, help="a folder with train.jsonl (GSM8K)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=2, help="questions a step")
    parser.add_argument("--generations", type=int, default=4, help="completions a question")
    parser.add_argument("--max-completion", type=int, help="tokens of a reply (default: the job's, 64 or 16)")
    parser.add_argument("--max-prompt", type=int, help="GRL's max_prompt_length (default: the job's)")
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument("--only", choices=["grl", "trl"], help="run one side only")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run both sides this many times, alternating which goes first, and print each round's ratio and "
        "their median",
    )
    parser.add_argument("--trl-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        return trl_worker(args.trl_worker)
    job = JOBS[args.job]
    args.max_completion = args.max_completion or job.max_completion
    args.max_prompt = args.max_prompt or job.max_prompt
    if job.uses_data and not (Path(args.data) / "train.jsonl").is_file():
        sys.exit(
            f"bench_vs_trl: --data {args.data}: no train.jsonl there (scripts/install_dataset.sh --gsm8k)"
        )
    python = trl_python() if args.only != "grl" else None
    if python is None and args.only != "grl":
        return
    cores = os.cpu_count() or 1
    env = {**os.environ, "OMP_NUM_THREADS": str(cores), "TOKENIZERS_PARALLELISM": "false"}
    load = os.getloadavg()[0]
    print(
        f"bench_vs_trl: {args.job} ({job.task}): {args.steps} steps x {args.prompts} prompts x "
        f"{args.generations} episodes, "
        f"<= {args.max_completion} tokens a reply, lr {args.lr}, fp32, {cores} cores, load average "
        f"{load:.1f} at start"
    )
    episodes = args.prompts * args.generations
    ratios = []
    for round_ in range(args.rounds):
        workdir = Path(tempfile.mkdtemp(prefix="bench_vs_trl_"))
        # On shared cores the machine's speed drifts over minutes; alternating which side goes
        # first spreads the drift over both.
        order = [side for side in ("grl", "trl") if args.only in (None, side)]
        results = {}
        for side in order if round_ % 2 == 0 else order[::-1]:
            if side == "grl":
                results["grl"] = summary("GRL", run_grl(args, workdir, env), episodes)
            else:
                trl = run_trl(args, python, workdir, env)
                print(f"bench_vs_trl: TRL side: {trl['versions']}")
                results["trl"] = summary("TRL", trl, episodes)
        if len(results) == 2:
            g, t = results["grl"], results["trl"]
            ratios.append(g["episodes_per_hour"] / t["episodes_per_hour"])
            print(
                f"round {round_ + 1}: ratio GRL/TRL (speed, > 1 = GRL faster): "
                + ", ".join(
                    f"{phase} {t[phase] / g[phase]:.2f}x" if g[phase] > 0 and t[phase] > 0 else f"{phase} -"
                    for phase in ("gen", "score", "update", "step")
                )
                + f", episodes/h {ratios[-1]:.2f}x (steps), "
                f"{g['wall_episodes_per_hour'] / t['wall_episodes_per_hour']:.2f}x (wall), "
                f"CPU seconds of the whole run {t['cpu_s'] / g['cpu_s']:.2f}x"
            )
        print(f"bench_vs_trl: logs in {workdir}; load average {os.getloadavg()[0]:.1f} at the end")
    if len(ratios) > 1:
        print(
            f"episodes/h GRL/TRL by rounds: {' '.join(f'{r:.2f}x' for r in ratios)}; "
            f"median {sorted(ratios)[(len(ratios) - 1) // 2]:.2f}x"
        )


if __name__ == "__main__":
    main()
