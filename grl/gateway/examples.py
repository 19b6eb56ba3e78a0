"""An agent program as a user writes one: plain Python over the `openai` client, nothing of GRL imported.
docs/TUTORIAL.md walks through it; configs/agents.yaml's `guessNumberProgram` trains it
(`agent_config.program: grl.gateway.examples:guess_number`)."""

import random
import re


def guess_number(client, task):
    """Guess a secret number from 1 to `max_number`; after each guess the program says higher or lower.
    Reward 1 for finding it, less the more guesses it took; `success` and `guesses` are its metrics."""
    top = int(task.config.get("max_number", 100))
    secret = random.Random(task.seed).randint(1, top)  # the seed is the group's: its attempts play one game
    messages = [
        {"role": "system", "content": "You are a careful player of guessing games."},
        {
            "role": "user",
            "content": f"I am thinking of a whole number from 1 to {top}. Guess it: "
            "answer with one number. After each guess I say higher or lower.",
        },
    ]
    for guess_count in range(1, int(task.config.get("max_guesses", 7)) + 1):
        reply = client.chat.completions.create(model=task.model, messages=messages, max_tokens=16)
        text = reply.choices[0].message.content or ""
        numbers = re.findall(r"-?\d+", text)
        messages.append(
            {"role": "assistant", "content": text}
        )  # sent back as received: one training sequence
        if not numbers:
            messages.append({"role": "user", "content": "Answer with one whole number."})
            continue
        guess = int(numbers[-1])
        if guess == secret:
            return {"reward": 1.0 - 0.1 * (guess_count - 1), "success": 1.0, "guesses": float(guess_count)}
        messages.append({"role": "user", "content": "Higher." if guess < secret else "Lower."})
    return {"reward": 0.0, "success": 0.0, "guesses": float(guess_count)}
