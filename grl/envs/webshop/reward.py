"""WebShop's purchase reward (Yao et al., 2022), as pure functions.

    reward = r_type * (n_attr + n_option + r_price) / (len(goal attributes) + len(goal options) + 1)

- n_attr: goal attributes found in the bought product (fuzzy match against its attribute list,
  else a substring of its title, bullet points or description);
- n_option: goal option values matched by a chosen option value (colours first reduced to a base
  colour, then a fuzzy match);
- r_price: 1 if the product's price is at most the goal's price limit;
- r_type in {0, 0.1, 0.5, 1}: same search query, shared category levels, and the share of the goal
  title's nouns present in the bought title.

Fuzzy matches are a token-set ratio above 85, as thefuzz computes it (written here, no dependency).
Title nouns come from spaCy's `en_core_web_sm` when asked for, else from a plain word filter.
One deliberate difference from WebShop's code: options are compared by value only (WebShop's
code compares `(name, value)` pairs of synthetic goals, which lets option names match by accident).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence

FUZZY_THRESHOLD = 85  # a token-set ratio above this counts as a match, as in WebShop

# WebShop's base colours, in WebShop's order: an option value becomes the first one it contains.
COLOR_SET = (
    "alabaster",
    "apricot",
    "aqua",
    "ash",
    "asphalt",
    "azure",
    "banana",
    "beige",
    "black",
    "blue",
    "blush",
    "bordeaux",
    "bronze",
    "brown",
    "burgundy",
    "camel",
    "camo",
    "caramel",
    "champagne",
    "charcoal",
    "cheetah",
    "chestnut",
    "chocolate",
    "christmas",
    "coffee",
    "cognac",
    "copper",
    "coral",
    "cranberry",
    "cream",
    "crystal",
    "dark",
    "denim",
    "eggplant",
    "elephant",
    "espresso",
    "fuchsia",
    "gold",
    "granite",
    "grape",
    "graphite",
    "grass",
    "gray",
    "green",
    "grey",
    "heather",
    "indigo",
    "ivory",
    "ivy",
    "khaki",
    "lavender",
    "lemon",
    "leopard",
    "light",
    "lilac",
    "lime",
    "magenta",
    "maroon",
    "mauve",
    "merlot",
    "midnight",
    "mint",
    "mocha",
    "multicolor",
    "mushroom",
    "mustard",
    "natural",
    "navy",
    "nude",
    "olive",
    "orange",
    "peach",
    "pewter",
    "pink",
    "plum",
    "purple",
    "rainbow",
    "red",
    "rose",
    "royal",
    "rust",
    "sand",
    "sapphire",
    "seashell",
    "silver",
    "skull",
    "slate",
    "steel",
    "stone",
    "stonewash",
    "sunflower",
    "tan",
    "taupe",
    "teal",
    "tiger",
    "turquoise",
    "violet",
    "walnut",
    "wheat",
    "white",
    "wine",
    "yellow",
)

# Words the plain title parser drops: they are never the product type.
_STOPWORDS = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "from",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "over",
        "s",
        "so",
        "such",
        "than",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "up",
        "was",
        "were",
        "will",
        "with",
        "without",
        "your",
        "you",
    }
)


def normalize_color(value: str) -> str:
    """The first base colour contained in `value`, else `value` unchanged."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def _fuzz_process(text: str) -> str:
    """thefuzz's default preprocessing: ASCII only, lower case, non-alphanumerics to spaces."""
    text = text.encode("ascii", "ignore").decode()
    return re.sub(r"[^0-9a-z]+", " ", text.lower()).strip()


def _lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence (one-row dynamic programme)."""
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for ch in a:
        diagonal = 0
        for j, other in enumerate(b, start=1):
            above = row[j]
            row[j] = diagonal + 1 if ch == other else max(row[j], row[j - 1])
            diagonal = above
    return row[-1]


def _ratio(a: str, b: str) -> float:
    """Indel similarity in [0, 100]: 200 * LCS / (len a + len b)."""
    total = len(a) + len(b)
    return 100.0 if total == 0 else 200.0 * _lcs_length(a, b) / total


def token_set_ratio(s1: str, s2: str) -> int:
    """thefuzz's `fuzz.token_set_ratio`: 100 when one token set contains the other, else the best
    ratio among the sorted intersection and the intersection plus each side's remaining tokens."""
    a, b = _fuzz_process(s1), _fuzz_process(s2)
    if not a or not b:
        return 0
    tokens_a, tokens_b = set(a.split()), set(b.split())
    sect = " ".join(sorted(tokens_a & tokens_b))
    with_a = f"{sect} {' '.join(sorted(tokens_a - tokens_b))}".strip()
    with_b = f"{sect} {' '.join(sorted(tokens_b - tokens_a))}".strip()
    best = max(_ratio(sect, with_a), _ratio(sect, with_b), _ratio(with_a, with_b))
    return round(best)


def fuzzy_match(a: str, b: str) -> bool:
    return token_set_ratio(a, b) > FUZZY_THRESHOLD


def plain_nouns(title: str) -> list[str]:
    """Content words of a title, the fallback for spaCy's nouns: lower-case alphabetic words
    that are not stop words."""
    return [w for w in re.findall(r"[a-z]+", title.lower()) if w not in _STOPWORDS and len(w) > 1]


@functools.lru_cache(maxsize=1)
def _spacy_model():
    import spacy  # optional: only the `spacy` title parser needs it

    return spacy.load("en_core_web_sm")


def spacy_available() -> bool:
    try:
        _spacy_model()
    except (ImportError, OSError):
        return False
    return True


@functools.lru_cache(maxsize=65536)
def spacy_nouns(title: str) -> list[str]:
    """Nouns and proper nouns of a title, as WebShop's type reward takes them."""
    return [t.text.lower() for t in _spacy_model()(title) if t.pos_ in ("NOUN", "PROPN")]


def type_reward(bought, goal: Mapping, nouns: Callable[[str], list[str]]) -> dict:
    """r_type: is the bought product the kind of thing the goal asks for?"""
    query_match = bought.query == goal["query"]
    bought_levels = {x.strip() for x in bought.product_category.split("›")}
    goal_levels = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(bought_levels & goal_levels) >= 2
    bought_nouns, goal_nouns = nouns(bought.name), nouns(goal["name"])
    # WebShop divides by the goal's noun list with repeats, and counts a title without nouns as 0.2
    title_score = len(set(bought_nouns) & set(goal_nouns)) / len(goal_nouns) if goal_nouns else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def count_attribute_matches(bought, goal_attributes: Sequence[str]) -> int:
    text_fields = (
        bought.name.lower(),
        " ".join(bought.bullet_points).lower(),
        bought.description.lower(),
    )
    matches = 0
    for wanted in goal_attributes:
        if any(fuzzy_match(have, wanted) for have in bought.attributes) or any(
            wanted in t for t in text_fields
        ):
            matches += 1
    return matches


def count_option_matches(chosen_values: Sequence[str], goal_values: Sequence[str]) -> int:
    chosen = [normalize_color(v) for v in chosen_values]
    return sum(any(fuzzy_match(c, normalize_color(g)) for c in chosen) for g in goal_values)


def purchase_reward(
    bought,
    price: float,
    chosen_options: Mapping[str, str],
    goal: Mapping,
    nouns: Callable[[str], list[str]] = plain_nouns,
) -> tuple[float, dict]:
    """WebShop's reward in [0, 1] for buying `bought` at `price` with `chosen_options`.

    `bought` has attributes `name`, `query`, `product_category`, `attributes`, `bullet_points` and
    `description` (a `catalog.Product`);
    `goal` has `name`, `query`, `product_category`, `attributes`, `goal_options` (name -> value),
    `price_upper`. Returns the reward and its parts.
    """
    goal_values = list(goal["goal_options"].values())
    r_type = type_reward(bought, goal, nouns)
    n_attr = count_attribute_matches(bought, goal["attributes"])
    n_option = count_option_matches(list(chosen_options.values()), goal_values)
    r_price = float(price <= goal["price_upper"])
    denominator = len(goal["attributes"]) + len(goal_values) + 1
    reward = r_type["r_type"] * (n_attr + n_option + r_price) / denominator
    parts = {
        **r_type,
        "r_attr": n_attr / len(goal["attributes"]) if goal["attributes"] else 1.0,
        "r_option": n_option / len(goal_values) if goal_values else 1.0,
        "r_price": r_price,
    }
    return reward, parts
