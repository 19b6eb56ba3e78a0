"""The HF engine's prompt log-probs (`Engine.prompt_log_probs`): each prompt's tokens scored by a no-grad
forward pass, as a served teacher scores a student's episode.

Rows are right-padded, so every row's tokens sit at positions 0..n-1 and the padding after them is never
attended to by a real token. A forward's logits are `rows x positions x vocab` floats: a batch of episodes
of a few thousand tokens over a 150k vocabulary would need tens of GiB at once, so a chunk of rows is run
in segments of positions over a KV cache (a chunked prefill), each segment's logits reduced to its tokens'
log-probs before the next is computed.
"""

from __future__ import annotations

import torch

from grl.engines.kv_slab import prefix_slab

# fp32 logits one forward may produce (rows x positions x vocab): 256 MiB, about three times that at the
# peak (the model's logits, their fp32 copy and its log-softmax).
LOGITS_BUDGET = 1 << 26


def prompt_log_probs(
    engine, prompt_token_ids: list[list[int]], logits_budget: int = LOGITS_BUDGET
) -> list[list[float]]:
    """For each prompt, log p(token t | tokens < t) for t = 1..n-1 under the plain softmax of `engine`'s
    model (an `HFEngine`), in fp32. Rows run in chunks of at most its `max_batch_size`, similar lengths
    together (little compute goes to padding)."""
    model, max_batch_size = engine.model, engine.max_batch_size
    order = sorted(range(len(prompt_token_ids)), key=lambda i: len(prompt_token_ids[i]))
    out: list[list[float] | None] = [None] * len(prompt_token_ids)
    for start in range(0, len(order), max_batch_size):
        chunk = order[start : start + max_batch_size]
        scores = _chunk_log_probs(
            model, [prompt_token_ids[i] for i in chunk], engine.pad_token_id, engine.device, logits_budget
        )
        for i, row in zip(chunk, scores):
            out[i] = row
    return out


def _chunk_log_probs(model, prompts, pad_token_id: int, device, logits_budget: int) -> list[list[float]]:
    rows, width = len(prompts), max(len(p) for p in prompts)
    if width == 1:  # one-token prompts have nothing to score
        return [[] for _ in prompts]
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, : len(prompt)] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    config = model.config.get_text_config()
    # The logits at positions 0..width-2 predict tokens 1..width-1; the last position predicts nothing.
    scored = width - 1
    segment = max(1, min(scored, logits_budget // (rows * config.vocab_size)))
    cache = prefix_slab([None] * rows, 0, scored, config.num_hidden_layers) if segment < scored else None
    log_probs = torch.empty((rows, scored), dtype=torch.float32, device=device)
    with torch.inference_mode():
        for begin in range(0, scored, segment):
            end = min(begin + segment, scored)
            logits = model(
                input_ids=input_ids[:, begin:end],
                attention_mask=attention_mask[:, :end],
                position_ids=torch.arange(begin, end, device=device).expand(rows, -1),
                past_key_values=cache,
                use_cache=cache is not None,
            ).logits
            targets = input_ids[:, begin + 1 : end + 1, None]
            log_probs[:, begin:end] = logits.float().log_softmax(-1).gather(-1, targets)[..., 0]
    table = log_probs.cpu().tolist()
    return [table[row][: len(prompt) - 1] for row, prompt in enumerate(prompts)]
