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


def teacher_forced_log_probs(model, prompt, response, sampling=None, allowed=None):
    """Log-probs of `response` under the distribution it was drawn from: the model's logits,
    scaled and filtered as `sampling` says (greedy: the plain softmax) and, with `allowed` (one
    (size, ids) set per response token, grl/engines/constraint.py), masked by a Python loop."""
    import torch

    from grl.engines.hf import filter_logits

    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0].float()[len(prompt) - 1 : -1]
    if sampling is not None and not sampling.is_greedy:
        logits = filter_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    if allowed is not None:
        for position, (size, members) in enumerate(allowed):
            for token in range(logits.shape[-1]):
                if (size > 0 and token not in members) or (size < 0 and token in members):
                    logits[position, token] = float("-inf")
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0]
