"""Short chat prompts shared by the engine tests and bench/bench_generation.py, and the
teacher-forced reference for the log-probs an engine reports."""

QUESTIONS = [
    "What is 2 + 3?",
    "Name a primary colour.",
    "Say hello in French.",
    "What is the capital of Italy?",
    "Give me a word that rhymes with cat.",
    "How many legs does a spider have?",
    "What is water made of?",
    "Write one short sentence about the sea.",
    "What comes after Monday?",
    "Is the sun a star?",
    "What is 10 times 7?",
    "Name a fruit that is yellow.",
    "Spell the word dog backwards.",
    "What do bees make?",
    "Which is bigger, 3 or 8?",
    "Name an animal that can fly.",
    "What is the opposite of hot?",
    "Translate 'thank you' into Spanish.",
    "How many days are in a week?",
    "What colour is grass?",
]


def chat_prompts(tokenizer, n: int = len(QUESTIONS)) -> list[list[int]]:
    """`n` chat-templated prompts (token ids), cycling through QUESTIONS."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


def teacher_forced_logits(model, prompt, response, sampling=None, allowed=None):
    """The logits each token of `response` was drawn from: the model's, masked by `allowed` (one (size, ids)
    set per response token, grl/engines/constraint.py) in a Python loop, then scaled and filtered as
    `sampling` says (greedy: left as they are), the order both engines apply them in."""
    import torch

    from grl.engines.kept_sets import filter_logits

    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0].float()[len(prompt) - 1 : -1]
    if allowed is not None:
        for position, (size, members) in enumerate(allowed):
            members = set(members)
            if size != 0:
                outside = [token for token in range(logits.shape[-1]) if (token in members) != (size > 0)]
                logits[position, outside] = float("-inf")
    if sampling is not None and not sampling.is_greedy:
        logits = filter_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    return logits


def teacher_forced_log_probs(model, prompt, response, sampling=None, allowed=None):
    """Log-probs of `response` under the distribution it was drawn from (`teacher_forced_logits`)."""
    import torch

    logits = teacher_forced_logits(model, prompt, response, sampling, allowed)
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def kept_members(kept_set, vocab: int) -> set[int]:
    """The ids of a kept set: those listed (+n), or all the others (-n)."""
    size, ids = kept_set
    return set(ids) if size > 0 else set(range(vocab)) - set(ids)


def assert_drawn_from_what_the_filter_kept(model, prompt, out, sampling, allowed=None):
    """Each token's kept set is what top-k/top-p keep of the teacher-forced (grammar-masked) logits, the
    token is in it, and its log-prob is that of the softmax over it."""
    import torch

    logits = teacher_forced_logits(model, prompt, out.token_ids, sampling, allowed)
    vocab = logits.shape[-1]
    want = [set(torch.isfinite(row).nonzero()[:, 0].tolist()) for row in logits]
    assert [kept_members(s, vocab) for s in out.kept_sets] == want
    assert all(token in members for token, members in zip(out.token_ids, want))
    log_probs = logits.log_softmax(-1).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(out.log_probs), log_probs, atol=1e-4)
