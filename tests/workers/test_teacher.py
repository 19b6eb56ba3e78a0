"""The teacher of on-policy distillation on real episodes: the tiny student's own multi-turn rollout,
scored by a local teacher on the actor's ranks (padded and packed rows) and by a served one (`grl serve`
over HTTP), against a token-by-token reference loop over the teacher's Hugging Face model."""

from dataclasses import replace

import pytest
import torch

from grl.config import compose, run_sections, validate
from grl.engines import sampling_from_config
from grl.rollout import Batch, MultiTurnRollout, build_batch, task_specs
from grl.run_plan import RunPlan

pytestmark = pytest.mark.slow  # two one-rank actor groups, a rollout and a served model


def teacher_folder(path):
    """A teacher that is not the student: the tiny model with every weight moved, its tokenizer kept."""
    from grl.models import load_causal_lm, load_tokenizer

    model = load_causal_lm("tiny", "float32", "cpu")
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(path)
    load_tokenizer("tiny").save_pretrained(path)
    return str(path)


def config(tmp, teacher: str):
    overrides = {
        "model_path": "tiny",
        "trainer.device": "cpu",
        "actor_rollout_ref.model.dtype": "float32",
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.temperature": 1.0,
        "max_response_length": 10,
        "rollout.agent_group_num": "[2]",
        "rollout.agent_group_size": "[2]",
        "simpleSokobanAgent.agent_config.max_turns": 2,
        "trainer.run_dir": str(tmp / "run"),
        "trainer.default_local_dir": str(tmp / "ckpt"),
        "critic.enable": False,
        "algorithm.adv_estimator": "opd",
        "teacher.model_path": teacher,
    }
    return validate(compose([f"{k}={v}" for k, v in overrides.items()]))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return teacher_folder(tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def groups(tmp_path_factory, folder):
    """(the group whose teacher is another model, the group whose teacher is the student itself)."""
    from grl.workers import ActorRolloutRefGroup, init_ray

    init_ray(None, num_cpus=2)
    made = []
    try:
        for teacher in (folder, "tiny"):
            cfg = config(tmp_path_factory.mktemp("run"), teacher)
            made.append(ActorRolloutRefGroup.from_config(cfg, RunPlan.from_config(cfg)))
        yield made
    finally:
        for group in made:
            group.shutdown()


@pytest.fixture(scope="module")
def batch(tmp_path_factory, groups):
    from grl.models import load_tokenizer

    run = run_sections(config(tmp_path_factory.mktemp("rollout"), "tiny"))
    rollout = MultiTurnRollout.from_config(
        run.rollout, run.data, run.tools, groups[0].engine, load_tokenizer("tiny")
    )
    sampling = sampling_from_config(run.actor_rollout_ref.rollout, validate=False, max_new_tokens=10)
    result = rollout.run(task_specs(run.rollout, run.tasks), 3, sampling)
    rollout.close()
    out, _ = build_batch(result.episodes, max_episode_length=4096)
    assert len(out) == 4 and int(out["loss_mask"].sum()) > 20
    assert all(len(ep.turns) == 2 for ep in result.episodes)  # two turns: env tokens between two replies
    return out


def reference_log_probs(model_path: str, batch) -> torch.Tensor:
    """log p(token t | tokens < t) of every sampled token, one unpadded forward per prefix."""
    from grl.models import load_causal_lm

    model = load_causal_lm(model_path, "float32", "cpu").eval()
    out = torch.zeros(batch["input_ids"].shape)
    with torch.no_grad():
        for b in range(len(batch)):
            for t in batch["loss_mask"][b].nonzero().flatten().tolist():
                logits = model(batch["input_ids"][b : b + 1, :t]).logits[0, -1].float()
                out[b, t] = torch.log_softmax(logits, -1)[batch["input_ids"][b, t]]
    return out


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_local_teacher_scores_exactly_the_student_s_tokens(groups, batch, folder, packed):
    group = groups[0]
    planned = group.plan
    group.plan = replace(planned, packing_capacity=4096 if packed else None)
    try:
        got = group.compute_teacher_log_probs(batch)
    finally:
        group.plan = planned
    mask = batch["loss_mask"] > 0
    want = reference_log_probs(folder, batch)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-4, rtol=0)
    student, _ = group.compute_log_probs(batch)  # the teacher is another model: it scores otherwise
    assert (student[mask] - got[mask]).abs().max() > 1e-2
    assert not got[~mask].any()  # nothing off the loss mask: prompts, env tokens, padding


def test_a_teacher_equal_to_the_student_gives_zero_advantage(groups, batch):
    from grl.algo import teacher_advantage

    group = groups[1]
    teacher = group.compute_teacher_log_probs(batch)
    policy, _ = group.compute_log_probs(batch)
    mask = batch["loss_mask"]
    assert teacher_advantage(teacher, policy, mask).abs().max() < 1e-5
    # against the engine's log-probs of what it sampled (what opd reads without an old-log-prob pass)
    assert teacher_advantage(teacher, batch["rollout_log_probs"], mask).abs().max() < 1e-4


@pytest.fixture(scope="module")
def serve_model():
    """`grl serve` of a model folder for a `with`: its base URL (tiny contexts need `--max-tokens 1`)."""
    from contextlib import contextmanager

    from grl.gateway.serving import serve_args, serve_gateway
    from tests.gateway.served import serve

    @contextmanager
    def serving(folder):
        gateway = serve_gateway(
            serve_args([folder, "--engine", "hf", "--dtype", "float32", "--max-tokens", "1"])
        )
        with serve(gateway) as url:
            yield url

    return serving


def test_a_served_teacher_scores_as_the_local_one(groups, batch, folder, serve_model):
    from grl.schema import Teacher
    from grl.workers.teacher import ServedTeacher

    local = groups[0].compute_teacher_log_probs(batch)
    with serve_model(folder) as url:
        teacher = ServedTeacher(Teacher(url=url))
        try:
            served, failed = teacher.score(batch)
        finally:
            teacher.close()
    assert failed == [] and teacher.model == folder
    mask = batch["loss_mask"] > 0
    torch.testing.assert_close(served[mask], local[mask], atol=1e-4, rtol=0)


def test_episodes_a_served_teacher_cannot_score_are_left_out_and_counted(
    groups, batch, folder, serve_model, tmp_path
):
    """A server that refuses the longer episodes (its context is shorter): those leave the step, counted;
    a server that stops answering fails every episode, which ends the step with one line."""
    import shutil

    from transformers import AutoConfig

    from grl.rollout.env_faults import InfraFailureError
    from grl.schema import Teacher
    from grl.workers.teacher import ServedTeacher, score_batch

    lengths = batch["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) > 1
    short = tmp_path / "short"
    shutil.copytree(folder, short)
    config = AutoConfig.from_pretrained(short)
    config.max_position_embeddings = int(lengths.max()) - 1
    config.save_pretrained(short)
    local = groups[0].compute_teacher_log_probs(batch)
    with serve_model(str(short)) as url:
        teacher = ServedTeacher(Teacher(url=url, retries=1))
        kept, metrics = score_batch(
            teacher, Batch(dict(batch.tensors), dict(batch.meta)), max_failed_ratio=0.75
        )
    longest = lengths == lengths.max()
    assert metrics["teacher/failed_episodes"] == float(longest.sum()) and len(kept) == int((~longest).sum())
    mask = kept["loss_mask"] > 0
    torch.testing.assert_close(kept["teacher_log_probs"][mask], local[~longest][mask], atol=1e-4, rtol=0)
    with pytest.raises(InfraFailureError, match=r"the teacher failed to score 4 of 4 episodes.*ConnectError"):
        score_batch(teacher, Batch(dict(batch.tensors), dict(batch.meta)), max_failed_ratio=0.5)
    teacher.close()


def test_a_windowed_episode_goes_to_a_served_teacher_one_context_at_a_time():
    from grl.workers.teacher import contexts

    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 0], [1, 2, 3, 0, 0, 0, 0]])
    windowed = Batch(
        {
            "input_ids": ids,
            "attention_mask": (torch.arange(7) < torch.tensor([[6], [3]])).long(),
            "context_ids": torch.tensor([[1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 0, 0, 0, 0]]),
        }
    )
    assert contexts(windowed, 0) == [(0, [5, 6, 7]), (3, [8, 9, 10])]
    assert contexts(windowed, 1) == [(0, [1, 2, 3])]
    whole = Batch({"input_ids": ids, "attention_mask": windowed["attention_mask"]})
    assert contexts(whole, 0) == [(0, [5, 6, 7, 8, 9, 10])]
