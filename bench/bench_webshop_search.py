"""WebShop search speed on the 1k-product set: BM25 (bm25s) vs. a naive token-overlap scan.

Both rank all 1,000 products for the same 300 goal instructions and keep the top 50. The target is
under 5 ms a query for BM25; the ratio shows what the index buys over scanning every product.

    python bench/bench_webshop_search.py [products.jsonl goals.json]
"""

import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grl.envs.webshop.catalog import load_catalog

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "webshop"
TOP_K, NUM_QUERIES, REPEATS = 50, 300, 3


def naive_scan(query: str, doc_tokens: list[set[str]], k: int) -> list[int]:
    """Baseline: score every product by the number of query words it contains."""
    words = set(re.findall(r"\w\w+", query.lower()))
    scores = [(len(words & tokens), -i) for i, tokens in enumerate(doc_tokens)]
    best = sorted((s for s in scores if s[0] > 0), reverse=True)[:k]
    return [-i for _, i in best]


def per_query_ms(search, queries) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for q in queries:
            search(q)
        best = min(best, time.perf_counter() - start)
    return best / len(queries) * 1e3


def main() -> None:
    products = sys.argv[1] if len(sys.argv) > 2 else DATA / "products_1k.jsonl"
    goals = sys.argv[2] if len(sys.argv) > 2 else DATA / "items_ins_v2_1000.json"
    start = time.perf_counter()
    catalog = load_catalog(products, goals)
    build_s = time.perf_counter() - start
    queries = [catalog.sample_goal(random.Random(seed))["instruction"] for seed in range(NUM_QUERIES)]
    doc_tokens = [set(re.findall(r"\w\w+", p.search_text.lower())) for p in catalog.products]

    bm25_ms = per_query_ms(lambda q: catalog.searcher.search(q, TOP_K), queries)
    naive_ms = per_query_ms(lambda q: naive_scan(q, doc_tokens, TOP_K), queries)
    print(f"products: {len(catalog.products)}, queries: {len(queries)}, top {TOP_K}")
    print(f"catalog load + BM25 index build: {build_s:.2f} s")
    print(f"bm25s search:       {bm25_ms:.3f} ms/query  (target < 5 ms: {'ok' if bm25_ms < 5 else 'MISSED'})")
    print(f"naive overlap scan: {naive_ms:.3f} ms/query")
    print(f"speed-up vs naive:  {naive_ms / bm25_ms:.1f}x")


if __name__ == "__main__":
    main()
