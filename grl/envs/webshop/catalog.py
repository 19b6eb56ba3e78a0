"""WebShop's shared, read-only data: the product table, its BM25 index and the goal pool.

A `Catalog` is built once per (products file, goals file) and cached for the process; every env
session reads it and never writes to it, so agents share it safely.
"""

from __future__ import annotations

import ast
import bisect
import json
import math
import os
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Price limits WebShop draws from: the goal's limit is one of the four tens just above the price.
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
NO_PRICE_LIMIT = 1_000_000.0
# Lucene's (pyserini's) BM25 defaults, the search engine WebShop ships with.
BM25_K1, BM25_B = 0.9, 0.4


@dataclass(frozen=True)
class Product:
    asin: str
    name: str
    query: str
    category: str
    product_category: str
    description: str
    bullet_points: tuple[str, ...]
    reviews: tuple[str, ...]
    rating: str
    price_tag: str
    price: float  # the price a purchase is charged and checked against the goal's limit
    options: dict[str, tuple[str, ...]]
    attributes: tuple[str, ...]
    search_text: str


# ---------------------------------------------------------------- parsing product records


def _literal(value: Any, default: Any) -> Any:
    """A nested field that may be stored as a Python-literal string (never `eval`)."""
    if isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return default
    return default if value is None else value


def _text_list(value: Any) -> tuple[str, ...]:
    """Bullet points and the like: a list, a literal list in a string, or one plain string."""
    parsed = _literal(value, None)
    if isinstance(parsed, (list, tuple)):
        return tuple(str(x) for x in parsed)
    if isinstance(value, str) and value.strip():
        return (value,)
    return ()


def _parse_price_string(text: str) -> list[float]:
    """'$19.99 - $27.99' -> [19.99, 27.99] (WebShop's raw `pricing`)."""
    prices = []
    for part in text.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            prices.append(float(digits))
        except ValueError:
            continue
    return prices


def _pricing(record: dict) -> list[float]:
    raw = record.get("pricing")
    if isinstance(raw, str) and "$" in raw:
        return _parse_price_string(raw)[:2]
    parsed = _literal(raw, [])
    if isinstance(parsed, (int, float)):
        parsed = [parsed]
    return [float(p) for p in parsed if isinstance(p, (int, float))][:2] if isinstance(parsed, list) else []


def _options_from_processed(record: dict) -> dict[str, tuple[str, ...]]:
    options = _literal(record.get("options"), {})
    if not isinstance(options, dict):
        return {}
    return {
        str(k): tuple(str(v) for v in values) for k, values in options.items() if isinstance(values, list)
    }


def _options_from_raw(record: dict) -> dict[str, tuple[str, ...]]:
    """WebShop's rule: option names and values lower-cased, '/' in a value shown as ' | '."""
    custom = _literal(record.get("customization_options"), {})
    if not isinstance(custom, dict):
        return {}
    options = {}
    for name, contents in custom.items():
        if not isinstance(contents, list):
            continue
        values = [c["value"] for c in contents if isinstance(c, dict) and isinstance(c.get("value"), str)]
        options[name.lower()] = tuple(v.strip().replace("/", " | ").lower() for v in values)
    return options


def _reviews(record: dict) -> tuple[str, ...]:
    reviews = _literal(record.get("Reviews"), [])
    lines = []
    for review in reviews if isinstance(reviews, list) else []:
        if isinstance(review, dict):
            score = review.get("score", review.get("stars", ""))
            body = review.get("body", review.get("review", ""))
            title = review.get("title", "")
            lines.append(" - ".join(str(x) for x in (score, title, body) if x))
        else:
            lines.append(str(review))
    return tuple(lines)


def _fixed_price(asin: str, pricing: list[float]) -> float:
    """WebShop charges a price range's item a uniform draw from the range; the draw is seeded by
    the ASIN so that every session and every run sees the same price."""
    if not pricing:
        return 100.0
    if len(pricing) == 1:
        return pricing[0]
    return random.Random(asin).uniform(pricing[0], pricing[1])


def _search_text(name: str, description: str, bullets: tuple[str, ...], options: dict) -> str:
    """WebShop's indexed document: title, description, first bullet point and options, lower-cased."""
    option_text = ", and ".join(f"{k}: {', '.join(v)}" for k, v in options.items())
    return " ".join([name, description, bullets[0] if bullets else "", option_text]).lower()


def parse_product(record: dict, contents: str | None, goal_attributes: list[str] | None) -> Product | None:
    """One product from a WebShop record, either processed (`Title`, `options`, ... as in the
    products JSONL) or raw (`name`, `customization_options`, ... as in `items_shuffle*.json`).
    Returns None for records WebShop skips (no ASIN, ASIN longer than 10)."""
    asin = str(record.get("asin", ""))
    if not asin or asin == "nan" or len(asin) > 10:
        return None
    processed = "Title" in record or "options" in record
    name = str(record.get("Title") if processed else record.get("name") or "")
    description = str(record.get("Description") if processed else record.get("full_description") or "")
    bullets = _text_list(record.get("BulletPoints") if processed else record.get("small_description"))
    options = _options_from_processed(record) if processed else _options_from_raw(record)
    pricing = _pricing(record)
    if "Price" in record:
        price_tag = str(record["Price"])
    elif len(pricing) == 2:
        price_tag = f"${pricing[0]} to ${pricing[1]}"
    else:
        price_tag = f"${pricing[0] if pricing else 100.0}"
    if goal_attributes is None:
        goal_attributes = _literal(record.get("Attributes"), [])
    return Product(
        asin=asin,
        name=name,
        query=str(record.get("query", "")).lower().strip(),
        category=str(record.get("category", "")),
        product_category=str(record.get("product_category", "")),
        description=description,
        bullet_points=bullets,
        reviews=_reviews(record),
        rating=str(record.get("Rating", "N.A.")),
        price_tag=price_tag,
        price=_fixed_price(asin, pricing),
        options=options,
        attributes=tuple(str(a) for a in goal_attributes) if isinstance(goal_attributes, list) else (),
        search_text=contents if contents is not None else _search_text(name, description, bullets, options),
    )


def _read_records(path: Path) -> list[tuple[dict, str | None]]:
    """(product record, indexed text or None) pairs from a JSON-lines or JSON-array file."""
    with path.open(encoding="utf-8") as f:
        head = f.read(1)
        while head.isspace():
            head = f.read(1)
        f.seek(0)
        rows = json.load(f) if head == "[" else [json.loads(line) for line in f if line.strip()]
    pairs = []
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get("product"), dict):
            pairs.append((row["product"], row.get("contents")))
        elif isinstance(row, dict):
            pairs.append((row, None))
    return pairs


# ---------------------------------------------------------------- search


_WORD = re.compile(r"(?u)\b\w\w+\b")


class Searcher:
    """BM25 (Lucene variant, bm25s) over the products' search texts, English stop words removed
    and words stemmed with the Snowball English stemmer."""

    def __init__(self, texts: list[str]):
        import bm25s  # imported here so that `import grl.envs` stays light
        import Stemmer
        from bm25s.stopwords import STOPWORDS_EN

        self._stopwords = frozenset(STOPWORDS_EN)
        self._stemmer = Stemmer.Stemmer("english")
        self._bm25 = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="lucene")
        self._bm25.index([self.tokenize(t) for t in texts], show_progress=False)

    def tokenize(self, text: str) -> list[str]:
        words = [w for w in _WORD.findall(text.lower()) if w not in self._stopwords]
        return self._stemmer.stemWords(words)

    def scores(self, query: str):
        """BM25 score of every document for `query` (a float32 numpy array)."""
        import numpy as np

        ids = self._bm25.get_tokens_ids(self.tokenize(query))
        if not ids:
            return np.zeros(self._bm25.scores["num_docs"], dtype=np.float32)
        return self._bm25.get_scores_from_ids(ids)

    def search(self, query: str, k: int) -> list[int]:
        """Indices of at most `k` documents with a positive score, best first (ties: file order)."""
        import numpy as np

        scores = self.scores(query)
        candidates = np.flatnonzero(scores > 0)
        if len(candidates) > k:
            candidates = candidates[np.argpartition(-scores[candidates], k - 1)[:k]]
        order = np.lexsort((candidates, -scores[candidates]))
        return candidates[order].tolist()


# ---------------------------------------------------------------- goals


@dataclass(frozen=True)
class GoalSpec:
    """A product with a goal instruction; a goal adds one value per option and a price limit."""

    product: Product
    instruction: str
    attributes: tuple[str, ...]


def _num_option_combinations(product: Product) -> int:
    return math.prod(len(values) for values in product.options.values())


class Catalog:
    """Products, their search index and the goal pool of one (products, goals) pair."""

    def __init__(self, products: list[Product], goal_specs: list[GoalSpec]):
        if not goal_specs:
            raise ValueError("webshop: no product has a goal instruction (check goals_path)")
        self.products = products
        self.by_asin = {p.asin: p for p in products}
        self.searcher = Searcher([p.search_text for p in products])
        self.goal_specs = goal_specs
        self._cum_weights = _cumulative(_goal_weights(goal_specs))

    def search(self, query: str, k: int) -> list[Product]:
        return [self.products[i] for i in self.searcher.search(query, k)]

    def sample_goal(self, rng: random.Random) -> dict:
        """A goal drawn as WebShop draws synthetic goals: a (product, option combination) pair with
        probability proportional to its attribute-rarity weight, then a price limit."""
        position = rng.random() * self._cum_weights[-1]
        spec = self.goal_specs[
            min(bisect.bisect_right(self._cum_weights, position), len(self.goal_specs) - 1)
        ]
        product = spec.product
        goal_options = {name: rng.choice(product.options[name]) for name in sorted(product.options)}
        above = [p for p in PRICE_RANGE if p > product.price][:4]
        if len(above) >= 2:
            price_upper = max(rng.sample(above, 2))
            price_text = f", and price lower than {price_upper:.2f} dollars"
        else:
            price_upper, price_text = NO_PRICE_LIMIT, ""
        option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
        option_text = f" with {option_text}" if option_text else ""
        return {
            "asin": product.asin,
            "instruction": f"{spec.instruction}{option_text}{price_text}",
            "attributes": list(spec.attributes),
            "goal_options": goal_options,
            "price_upper": price_upper,
            "name": product.name,
            "query": product.query,
            "category": product.category,
            "product_category": product.product_category,
        }


def _goal_weights(specs: list[GoalSpec]) -> list[float]:
    """WebShop weighs each synthetic goal by the mean rarity (1 / count over all goals) of its
    attributes; a product carries one goal per option combination, all with the same weight."""
    combos = [_num_option_combinations(s.product) for s in specs]
    counts: Counter[str] = Counter()
    for spec, n in zip(specs, combos):
        for attribute in spec.attributes:
            counts[attribute] += n
    return [n * sum(1.0 / counts[a] for a in s.attributes) / len(s.attributes) for s, n in zip(specs, combos)]


def _cumulative(weights: list[float]) -> list[float]:
    total, out = 0.0, []
    for w in weights:
        total += w
        out.append(total)
    return out


def _goal_specs(goals: dict, by_asin: dict[str, Product]) -> list[GoalSpec]:
    specs = []
    for asin, entry in goals.items():
        product = by_asin.get(asin)
        if product is None or not isinstance(entry, dict):
            continue
        instruction, attributes = entry.get("instruction"), entry.get("instruction_attributes")
        if not instruction or not attributes or _num_option_combinations(product) == 0:
            continue
        specs.append(GoalSpec(product, str(instruction), tuple(str(a) for a in attributes)))
    return specs


def build_catalog(products_path: Path, goals_path: Path) -> Catalog:
    with goals_path.open(encoding="utf-8") as f:
        goals = json.load(f)
    if not isinstance(goals, dict):
        raise TypeError(f"webshop: goals_path {goals_path} must hold a JSON object keyed by ASIN")
    products, seen = [], set()
    for record, contents in _read_records(products_path):
        entry = goals.get(record.get("asin"))
        attributes = entry.get("attributes") if isinstance(entry, dict) and "attributes" in entry else None
        product = parse_product(record, contents, attributes)
        if product is not None and product.asin not in seen:
            seen.add(product.asin)
            products.append(product)
    if not products:
        raise ValueError(f"webshop: no products in products_path {products_path}")
    return Catalog(products, _goal_specs(goals, {p.asin: p for p in products}))


_CACHE: dict[tuple, Catalog] = {}
_CACHE_LOCK = threading.Lock()


def load_catalog(products_path: str | os.PathLike, goals_path: str | os.PathLike) -> Catalog:
    """The catalog of two files, built on first use and shared by every session of the process
    (rebuilt if a file changes)."""
    paths = []
    for key, path in (("products_path", products_path), ("goals_path", goals_path)):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"webshop: {key} {str(path)!r} not found (run scripts/install_dataset.sh --webshop)"
            )
        paths.append(path.resolve())
    key = tuple((str(p), p.stat().st_mtime_ns) for p in paths)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = build_catalog(*paths)
        return _CACHE[key]
