"""Input dependence of a policy over a rollout (RAGEN-2's decomposition).

The entropy of the answers splits into what the observation explains and what
it does not:  H(Z) = I(X; Z) + H(Z | X),  with X the state an answer acted on
(`Turn.state_key`, the hash of the rendered observation) and Z the answer the
reply gave (the parsed action; the reply's tokens when it had none). Plug-in
estimates over every turn of a task's episodes:

- `input_mi`: I(X; Z) in nats. ~0 means the answers do not change with what
  the model is shown (a fixed template such as "always Down"), even when
  success is high and the token entropy looks healthy: "template collapse".
- `input_mi_norm`: I(X; Z) / H(Z), the share of the answers' variety that the
  state explains (1: a function of the state; 0: independent of it).
- `answer_cond_entropy`: H(Z | X), the variety left within a state: high under
  sampling is exploration, high under greedy decoding means the answer follows
  something other than the board (the history, the turn number).

When to worry: `input_mi` falling towards 0 while success stays flat or rises
(the policy found a constant), or `input_mi_norm` well below 1 under greedy
validation. The plug-in MI is biased upwards when most states are seen once
(then every answer is "explained" by its state): compare it with the swap
control (`success_swapped`), which has no such bias.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

from grl.rollout.types import Episode


def entropy(counts: Counter) -> float:
    total = sum(counts.values())
    return -sum(n / total * math.log(n / total) for n in counts.values() if n) if total else 0.0


def mutual_information(pairs: Sequence[tuple[Hashable, Hashable]]) -> tuple[float, float, float]:
    """(I(X; Z), H(Z | X), H(Z)) of the empirical joint distribution of (x, z) pairs, in nats."""
    if not pairs:
        return 0.0, 0.0, 0.0
    h_z = entropy(Counter(z for _, z in pairs))
    by_state: dict[Hashable, Counter] = {}
    for x, z in pairs:
        by_state.setdefault(x, Counter())[z] += 1
    h_z_given_x = sum(sum(c.values()) / len(pairs) * entropy(c) for c in by_state.values())
    return max(h_z - h_z_given_x, 0.0), h_z_given_x, h_z


def _answer(turn) -> Hashable:
    answer = turn.info.get("answer")
    return answer.strip() if isinstance(answer, str) else tuple(turn.response_ids)


def input_dependence_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """`<task>/input_mi`, `<task>/input_mi_norm`, `<task>/answer_cond_entropy` per task."""
    pairs_of: dict[str, list[tuple[Hashable, Hashable]]] = {}
    for ep in episodes:
        if ep.error is None:
            pairs_of.setdefault(ep.task, []).extend((t.state_key, _answer(t)) for t in ep.turns)
    metrics = {}
    for task, pairs in pairs_of.items():
        mi, cond, h_z = mutual_information(pairs)
        metrics[f"{task}/input_mi"] = mi
        metrics[f"{task}/input_mi_norm"] = mi / h_z if h_z > 0 else 0.0
        metrics[f"{task}/answer_cond_entropy"] = cond
    return metrics
