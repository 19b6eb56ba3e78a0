"""The teacher of on-policy distillation, as the trainer sees it: `score(batch)` -> its log-probs of every
token of the batch's rows and the rows it could not score.

- `LocalTeacher`: a frozen model on the actor's ranks (teacher.model_path), scored like the reference:
  the student's sampling temperature and allowed sets, packing and context windows alike.
- `ServedTeacher`: an OpenAI-compatible server (teacher.url: `vllm serve`, `grl serve`) asked for the
  prompt log-probs of each episode's exact token ids (`/v1/completions` with `echo`, `max_tokens` 0). A
  windowed episode (`context_ids`) is sent as one prompt per context, as the trainer scores it. What the
  server answers is checked (one finite log-prob <= 0 per token); an episode it cannot score after
  `teacher.retries` is left out of the step and counted, an infrastructure failure, never a sample.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from grl.rollout import Batch
from grl.rollout.env_faults import InfraFailureError
from grl.schema import Teacher

log = logging.getLogger("grl.teacher")

# A log-prob a little above 0 is rounding (a token of probability 1 in bf16); far above is no log-prob.
LOG_PROB_SLACK = 1e-3


class TeacherError(RuntimeError):
    """A served teacher that cannot be used: unreachable, another tokenizer, a short context, bad answers."""


class LocalTeacher:
    def __init__(self, actor):
        self._actor = actor  # grl.workers.ActorRolloutRefGroup, built with the teacher

    def score(self, batch: Batch) -> tuple[torch.Tensor, list[tuple[int, str]]]:
        return self._actor.compute_teacher_log_probs(batch), []

    def close(self) -> None:
        pass


class ServedTeacher:
    def __init__(self, section: Teacher, client=None):
        import httpx

        self.section = section
        self.url = section.url.rstrip("/")
        self._client = client or httpx.Client(timeout=section.timeout_s)
        self.model = section.served_model or served_models(self._client, self.url)[0]
        self._pool = ThreadPoolExecutor(section.max_requests, thread_name_prefix="grl-teacher")

    def score(self, batch: Batch) -> tuple[torch.Tensor, list[tuple[int, str]]]:
        """`[B, T]` log-probs (0 where a token has none: a context's first token, padding, a failed row) and
        (row, error) of each row the server did not score."""
        out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
        jobs = [(row, start, ids) for row in range(len(batch)) for start, ids in contexts(batch, row)]
        results = list(self._pool.map(lambda job: self._prompt_log_probs(job[2]), jobs))
        failed: dict[int, str] = {}
        for (row, start, ids), (log_probs, error) in zip(jobs, results):
            if error is not None:
                failed.setdefault(row, error)
            else:
                out[row, start + 1 : start + len(ids)] = torch.tensor(log_probs)
        for row in failed:
            out[row] = 0.0
        return out, sorted(failed.items())

    def _prompt_log_probs(self, ids: list[int]) -> tuple[list[float] | None, str | None]:
        error = ""
        for attempt in range(self.section.retries + 1):
            if attempt:
                time.sleep(min(2.0**attempt * 0.1, 2.0))
            try:
                return prompt_log_probs(self._client, self.url, self.model, ids), None
            except Exception as err:  # noqa: BLE001 - the server, the network or the answer: count it, go on
                error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        return None, error

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


def contexts(batch: Batch, row: int) -> list[tuple[int, list[int]]]:
    """(first position, token ids) of each context the trainer scores row `row` in: the whole episode, or
    each turn prompt of a windowed one (`context_ids` 1, 2, ...)."""
    length = int(batch["attention_mask"][row].sum())
    ids = batch["input_ids"][row, :length].tolist()
    if "context_ids" not in batch:
        return [(0, ids)]
    spans, context = [], batch["context_ids"][row, :length].tolist()
    start = 0
    for t in range(1, length + 1):
        if t == length or context[t] != context[start]:
            spans.append((start, ids[start:t]))
            start = t
    return spans


def served_models(client, url: str) -> list[str]:
    response = client.get(f"{url}/v1/models")
    response.raise_for_status()
    names = [m["id"] for m in response.json().get("data", []) if isinstance(m, dict) and "id" in m]
    if not names:
        raise TeacherError(f"{url}/v1/models lists no model")
    return names


def prompt_log_probs(client, url: str, model: str, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1 under the served model's plain softmax, checked."""
    response = client.post(
        f"{url}/v1/completions",
        json={
            "model": model,
            "prompt": ids,
            "max_tokens": 0,
            "echo": True,
            "logprobs": 0,
            "temperature": 1.0,
        },
    )
    if response.status_code != 200:
        raise TeacherError(f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        values = response.json()["choices"][0]["logprobs"]["token_logprobs"]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise TeacherError(f"the answer holds no choices[0].logprobs.token_logprobs ({err!r})") from None
    if not isinstance(values, list) or len(values) != len(ids):
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise TeacherError(f"{got} prompt log-probs for {len(ids)} tokens")
    rest = values[1:]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v <= LOG_PROB_SLACK for v in rest):
        raise TeacherError("a prompt log-prob that is not a finite number <= 0")
    return [min(float(v), 0.0) for v in rest]


def check_served(section: Teacher, student_tokenizer, context: int, probe: str) -> None:
    """TeacherError, one line, unless the served teacher answers within seconds, serves the model asked for,
    tokenizes `probe` (text with the chat template's special tokens) as the student does, and holds
    `context` tokens."""
    import httpx

    url = section.url.rstrip("/")
    with httpx.Client(timeout=10.0) as client:
        try:
            names = served_models(client, url)
        except (httpx.HTTPError, ValueError) as err:
            raise TeacherError(f"cannot reach {url}/v1/models: {err}") from None
        model = section.served_model or names[0]
        if model not in names:
            raise TeacherError(f"{url} serves {', '.join(names)}, not teacher.served_model={model!r}")
        try:
            response = client.post(
                f"{url}/tokenize", json={"model": model, "prompt": probe, "add_special_tokens": False}
            )
            response.raise_for_status()
            answer = response.json()
        except (httpx.HTTPError, ValueError) as err:
            raise TeacherError(
                f"{url}/tokenize (which checks the teacher's tokenizer) failed: {err}"
            ) from None
    if answer.get("tokens") != student_tokenizer.encode(probe, add_special_tokens=False):
        raise TeacherError(
            f"{model} at {url} tokenizes text differently from the student; distillation needs the same "
            "tokenizer (across tokenizers it is not supported)"
        )
    served_context = answer.get("max_model_len")
    if isinstance(served_context, int) and served_context < context:
        raise TeacherError(f"{model} at {url} holds {served_context} tokens, fewer than the run's {context}")


def teacher_from(section: Teacher, plan, actor):
    """The run's teacher: local where the plan has one, served, or None."""
    if plan.teacher == "local":
        return LocalTeacher(actor)
    if plan.teacher == "served":
        return ServedTeacher(section)
    return None


def score_batch(teacher, batch: Batch, max_failed_ratio: float) -> tuple[Batch, dict[str, float]]:
    """The batch with the teacher's log-probs (`teacher_log_probs`), less the rows it could not score;
    InfraFailureError when those are more than `max_failed_ratio` (rollout.max_infra_failed_ratio) of it,
    or all of it."""
    log_probs, failed = teacher.score(batch)
    batch["teacher_log_probs"] = log_probs
    if failed and (len(failed) > max_failed_ratio * len(batch) or len(failed) == len(batch)):
        raise InfraFailureError(
            f"the teacher failed to score {len(failed)} of {len(batch)} episodes, more than "
            f"rollout.max_infra_failed_ratio {max_failed_ratio:g}; last: {failed[-1][1]}"
        )
    if failed:
        log.warning("the teacher failed to score %d episodes (left out): %s", len(failed), failed[-1][1])
        keep = torch.ones(len(batch), dtype=torch.bool)
        keep[[row for row, _ in failed]] = False
        batch = batch.select(keep)
    return batch, {"teacher/failed_episodes": float(len(failed))}
