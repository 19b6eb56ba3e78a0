"""`teacher`: the frozen model of on-policy distillation, which scores the student's own episodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grl.schema.keys import key


@dataclass
class Teacher:
    model_path: Optional[str] = key(
        None,
        "the frozen teacher that scores every sampled token: a hub id, a local folder (an hf_actor export), "
        "`embedded` or `tiny`, loaded beside the reference on the actor's ranks; null: no teacher",
    )
    url: Optional[str] = key(
        None,
        "a served teacher instead: the base URL of an OpenAI-compatible server that returns prompt log-probs "
        "(`vllm serve`, `grl serve`), e.g. http://host:8000; it scores the plain softmax at temperature 1",
    )
    served_model: Optional[str] = key(
        None, "the model a served teacher is asked for; null: the first its /v1/models lists"
    )
    advantage_coef: float = key(
        1.0,
        "weight of the teacher's per-token advantage (log p_teacher - log p_student of each sampled token) "
        "added to algorithm.adv_estimator's; with adv_estimator=opd that term is the whole advantage",
        ge=0,
    )
    timeout_s: float = key(60.0, "seconds a served teacher may take to score one episode", gt=0)
    retries: int = key(
        2, "times a served teacher's failed request is sent again before its episode is left out", ge=0
    )
    max_requests: int = key(8, "a served teacher's requests in flight", ge=1)


def teacher_problem(teacher: dict, needs_teacher: bool) -> str | None:
    """What is wrong with the `teacher` section beside the estimator that reads it, in one line (None:
    nothing). `needs_teacher`: the advantage estimator reads the teacher's log-probs."""
    path, url = teacher.get("model_path"), teacher.get("url")
    if path is not None and url is not None:
        return "teacher.model_path and teacher.url: name one teacher, a local model or a served one"
    if needs_teacher and path is None and url is None:
        return "algorithm.adv_estimator=opd distils a teacher; set teacher.model_path (or teacher.url)"
    if url is not None and not str(url).startswith(("http://", "https://")):
        return f"teacher.url: {url!r} is not an http(s) URL"
    return None
