"""The WebShop session: pages, actions and the purchase (see the package docstring)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from grl.envs.base import Env, resolve_data_path, step_info
from grl.envs.webshop import reward as rewards
from grl.envs.webshop.catalog import Catalog, Product, load_catalog

SEARCH, RESULTS, ITEM, DETAIL, DONE = "search", "results", "item", "detail", "done"
BACK_TO_SEARCH, PREV, NEXT, BUY = "back to search", "< prev", "next >", "buy now"
DETAIL_PAGES = ("description", "features", "reviews")

_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)


def parse_action(text: str) -> tuple[str, str] | None:
    """'search[red shoes]' -> ('search', 'red shoes'); the argument is lower-cased and stripped.
    None if `text` is neither action (never raises)."""
    match = _ACTION.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    return match.group(1).lower(), " ".join(match.group(2).split()).lower()


@dataclass
class _Session:
    page: str = SEARCH
    query: str = ""
    results: list[Product] = field(default_factory=list)
    page_no: int = 1
    product: Product | None = None
    options: dict[str, str] = field(default_factory=dict)
    detail: str = ""

    def snapshot(self) -> tuple:
        asin = self.product.asin if self.product else None
        return (self.page, self.query, self.page_no, asin, tuple(sorted(self.options.items())), self.detail)


class WebShopEnv(Env):
    """WebShop shopping session over a product catalog (see `grl.envs.webshop`)."""

    def __init__(
        self,
        products_path: str = "data/webshop/items_shuffle_1000.json",
        goals_path: str = "data/webshop/items_ins_v2_1000.json",
        search_top_k: int = 50,
        results_per_page: int = 10,
        max_text_chars: int = 2000,
        title_parser: str = "auto",
    ):
        if title_parser not in ("auto", "spacy", "plain"):
            raise ValueError(f"webshop: title_parser must be auto, spacy or plain, not {title_parser!r}")
        if search_top_k < 1 or results_per_page < 1:
            raise ValueError("webshop: search_top_k and results_per_page must be positive")
        if title_parser == "spacy" and not rewards.spacy_available():
            raise ValueError("webshop: title_parser=spacy needs spacy and its en_core_web_sm model")
        use_spacy = title_parser == "spacy" or (title_parser == "auto" and rewards.spacy_available())
        self.title_parser = "spacy" if use_spacy else "plain"
        self._nouns = rewards.spacy_nouns if use_spacy else rewards.plain_nouns
        self.catalog: Catalog = load_catalog(resolve_data_path(products_path), resolve_data_path(goals_path))
        self.search_top_k = search_top_k
        self.results_per_page = results_per_page
        self.max_text_chars = max_text_chars
        self.goal: dict[str, Any] = {}
        self._session: _Session | None = None
        self._bought: tuple[Product, dict[str, str], float] | None = None
        self.purchased = False

    # ------------------------------------------------------------------ contract

    def reset(self, seed: int) -> str:
        self.goal = self.catalog.sample_goal(random.Random(seed))
        self._session = _Session()
        self._bought = None
        self.purchased = False
        return self.render()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._session is None:
            raise RuntimeError("webshop: call reset(seed) before step()")
        if self._session.page == DONE:
            return self.render(), 0.0, True, step_info(False, False, False, purchased=self.purchased)
        parsed = parse_action(action)
        before = self._session.snapshot()
        reward, parts = 0.0, None
        valid = parsed is not None and self._is_available(*parsed)
        if valid:
            kind, arg = parsed
            if kind == "search":
                self._search(arg)
            elif arg == BUY:
                reward, parts = self._buy()
            else:
                self._click(arg)
        done = self._session.page == DONE
        observation = self.render()
        if not valid:
            observation = (
                "Invalid action: "
                f"{action.strip()[:200] if isinstance(action, str) else action!r}\n{observation}"
            )
        extra = {"purchased": self.purchased}
        if parts is not None:
            extra["reward_parts"] = parts
        success = self.purchased and reward >= 1.0 - 1e-9
        effective = valid and self._session.snapshot() != before
        return observation, reward, done, step_info(success, valid, effective, **extra)

    def action_help(self) -> str:
        return (
            "Actions: search[<keywords>] on the search page, and click[<item>] where <item> is a button, "
            "a product ASIN or an option value listed under 'Available actions'. click[buy now] on a "
            "product page buys it with the options chosen so far and ends the episode."
        )

    # ------------------------------------------------------------------ pages and actions

    def valid_actions(self) -> list[str]:
        """The clickables of the page, or a search with free-text keywords on the search page."""
        if self._session.page == SEARCH:
            return ["search[{text}]"]
        return self.available_actions()

    def available_actions(self) -> list[str]:
        """Every action accepted on the current page, as the model should write it."""
        if self._session.page == SEARCH:
            return ["search[<keywords>]"]
        return [f"click[{label}]" for label in self._clickables()]

    def _clickables(self) -> dict[str, str | Product]:
        """Click targets of the page: label -> 'button', a product, or the option name of a value."""
        s = self._session
        targets: dict[str, str | Product] = {}
        if s.page == RESULTS:
            targets[BACK_TO_SEARCH] = "button"
            if s.page_no > 1:
                targets[PREV] = "button"
            if s.page_no < self._num_pages():
                targets[NEXT] = "button"
            for product in self._page_results():
                targets[product.asin.lower()] = product
        elif s.page == ITEM:
            for label in (BACK_TO_SEARCH, PREV, *DETAIL_PAGES, BUY):
                targets[label] = "button"
            for name, values in s.product.options.items():
                for value in values:
                    targets.setdefault(value, name)
        elif s.page == DETAIL:
            targets[BACK_TO_SEARCH] = targets[PREV] = "button"
        return targets

    def _is_available(self, kind: str, arg: str) -> bool:
        if kind == "search":
            return self._session.page == SEARCH and bool(arg)
        return arg in self._clickables()

    def _search(self, query: str) -> None:
        s = self._session
        s.page, s.query, s.page_no = RESULTS, query, 1
        s.results = self.catalog.search(query, self.search_top_k)

    def _click(self, label: str) -> None:
        s = self._session
        target = self._clickables()[label]
        if label == BACK_TO_SEARCH:
            self._session = _Session()
        elif label == NEXT:
            s.page_no += 1
        elif label == PREV and s.page == RESULTS:
            s.page_no -= 1
        elif label == PREV and s.page == ITEM:
            s.page, s.product, s.options = RESULTS, None, {}
        elif label == PREV and s.page == DETAIL:
            s.page, s.detail = ITEM, ""
        elif isinstance(target, Product):
            s.page, s.product, s.options = ITEM, target, {}
        elif label in DETAIL_PAGES:
            s.page, s.detail = DETAIL, label
        else:
            s.options[target] = label

    def _buy(self) -> tuple[float, dict]:
        s = self._session
        reward, parts = rewards.purchase_reward(s.product, s.product.price, s.options, self.goal, self._nouns)
        s.page = DONE
        self.purchased = True
        self._bought = (s.product, dict(s.options), reward)
        return reward, parts

    def _num_pages(self) -> int:
        return max(1, -(-len(self._session.results) // self.results_per_page))

    def _page_results(self) -> list[Product]:
        start = (self._session.page_no - 1) * self.results_per_page
        return self._session.results[start : start + self.results_per_page]

    # ------------------------------------------------------------------ rendering

    def render(self) -> str:
        """The current page: the instruction, the page's content and its available actions."""
        s = self._session
        if s is None:
            raise RuntimeError("webshop: call reset(seed) before render()")
        body = {
            SEARCH: self._render_search,
            RESULTS: self._render_results,
            ITEM: self._render_item,
            DETAIL: self._render_detail,
            DONE: self._render_done,
        }[s.page]()
        lines = [f"Instruction: {self.goal.get('instruction', '')}", body]
        if s.page != DONE:
            lines.append("Available actions: " + ", ".join(self.available_actions()))
        return "\n".join(lines)

    def _render_search(self) -> str:
        return "Page: search. Type keywords to search the shop."

    def _render_results(self) -> str:
        s = self._session
        if not s.results:
            return f'Page: results for "{s.query}". No product matches.'
        head = (
            f'Page: results for "{s.query}", page {s.page_no} of {self._num_pages()} '
            f"({len(s.results)} products)."
        )
        rows = [f"[{p.asin}] {p.name} | {p.price_tag}" for p in self._page_results()]
        return "\n".join([head, *rows])

    def _render_item(self) -> str:
        s = self._session
        p = s.product
        lines = [
            f"Page: product {p.asin}.",
            f"Title: {p.name}",
            f"Price: {p.price_tag}",
            f"Rating: {p.rating}",
        ]
        if p.options:
            lines.append("Options (click a value to choose it):")
            for name, values in p.options.items():
                shown = [f"{v} (chosen)" if s.options.get(name) == v else v for v in values]
                lines.append(f"  {name}: " + "; ".join(shown))
        return "\n".join(lines)

    def _render_detail(self) -> str:
        s = self._session
        p = s.product
        if s.detail == "description":
            text = p.description.strip() or "(no description)"
        elif s.detail == "features":
            text = "\n".join(f"- {b.strip()}" for b in p.bullet_points) or "(no features)"
        else:
            text = "\n".join(f"- {r.strip()}" for r in p.reviews) or "(no reviews)"
        if len(text) > self.max_text_chars:
            text = text[: self.max_text_chars] + " ..."
        return f"Page: {s.detail} of product {p.asin}.\n{text}"

    def _render_done(self) -> str:
        product, options, reward = self._bought
        chosen = ", ".join(f"{k}: {v}" for k, v in options.items()) or "none"
        return (
            f"Page: done. You bought {product.asin} ({product.name}) with options {chosen} "
            f"at ${product.price:.2f}. Reward: {reward:.3f}."
        )
