"""Short chat prompts shared by the engine tests and bench/bench_generation.py."""

QUESTIONS = [
    "What is 2 + 3?", "Name a primary colour.", "Say hello in French.", "What is the capital of Italy?",
    "Give me a word that rhymes with cat.", "How many legs does a spider have?", "What is water made of?",
    "Write one short sentence about the sea.", "What comes after Monday?", "Is the sun a star?",
    "What is 10 times 7?", "Name a fruit that is yellow.", "Spell the word dog backwards.",
    "What do bees make?", "Which is bigger, 3 or 8?", "Name an animal that can fly.",
    "What is the opposite of hot?", "Translate 'thank you' into Spanish.", "How many days are in a week?",
    "What colour is grass?",
]


def chat_prompts(tokenizer, n: int = len(QUESTIONS)) -> list[list[int]]:
    """`n` chat-templated prompts (token ids), cycling through QUESTIONS."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False)
            for i in range(n)]
