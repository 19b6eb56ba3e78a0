"""WebShop env on the real 1k-product set (../shared/data/webshop) and small fixtures built here."""

import itertools
import json
import math
import random
import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

import grl.envs
from grl.envs.webshop import WebShopEnv, parse_action
from grl.envs.webshop import catalog as cat
from grl.envs.webshop import reward as rw

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "webshop"
PRODUCTS, GOALS = DATA / "products_1k.jsonl", DATA / "items_ins_v2_1000.json"
needs_data = pytest.mark.shared_data("webshop/products_1k.jsonl", "webshop/items_ins_v2_1000.json")


@pytest.fixture(scope="module")
def make_env():
    # the catalog (products + BM25 index) is built once and shared by every env of the module
    return lambda: WebShopEnv(products_path=str(PRODUCTS), goals_path=str(GOALS), title_parser="plain")


def product_actions(env):
    return [a for a in env.available_actions() if re.fullmatch(r"click\[[a-z0-9]{10}\]", a)]


def open_goal_product(env, seed):
    """Reset, search the goal product's title and open its page (paging through the results)."""
    env.reset(seed)
    goal = env.goal
    env.step(f"search[{goal['name']}]")
    target = f"click[{goal['asin'].lower()}]"
    while target not in env.available_actions():
        assert "click[next >]" in env.available_actions(), "goal product not found by its own title"
        env.step("click[next >]")
    _, reward, done, info = env.step(target)
    assert info["action_is_valid"] and not done and reward == 0.0
    return goal


# ---------------------------------------------------------------- rewards on the real set


@needs_data
@pytest.mark.parametrize("seed", range(12))
def test_goal_product_with_goal_options_gives_reward_one(make_env, seed):
    env = make_env()
    goal = open_goal_product(env, seed)
    for value in goal["goal_options"].values():
        _, _, _, info = env.step(f"click[{value}]")
        assert info["action_is_valid"]
    obs, reward, done, info = env.step("click[buy now]")
    assert reward == 1.0 and done and info["success"] and info["purchased"]
    assert "Page: done" in obs


@needs_data
def test_wrong_product_gives_less(make_env):
    env = make_env()
    for seed in range(8):
        env.reset(seed)
        env.step(f"search[{env.goal['name']}]")
        others = [a for a in product_actions(env) if env.goal["asin"].lower() not in a]
        env.step(others[0])
        _, reward, done, info = env.step("click[buy now]")
        assert done and info["purchased"] and not info["success"]
        assert 0.0 <= reward < 1.0


@needs_data
def test_wrong_or_missing_options_give_less(make_env):
    env = make_env()
    checked = 0
    for seed in range(40):
        env.reset(seed)
        if not env.goal["goal_options"]:
            continue
        product = env.catalog.by_asin[env.goal["asin"]]
        # one option gets a value that does not match the goal's, the others get the goal's
        name, wanted = next(iter(env.goal["goal_options"].items()))
        wrong = [
            v
            for v in product.options[name]
            if not rw.fuzzy_match(rw.normalize_color(v), rw.normalize_color(wanted))
        ]
        if not wrong:
            continue
        goal = open_goal_product(env, seed)
        for other_name, value in goal["goal_options"].items():
            env.step(f"click[{wrong[0] if other_name == name else value}]")
        _, reward, _, info = env.step("click[buy now]")
        n_attr, n_opt = len(goal["attributes"]), len(goal["goal_options"])
        assert reward == pytest.approx((n_attr + n_opt - 1 + 1) / (n_attr + n_opt + 1))
        assert not info["success"]
        # the same product bought with no option chosen
        open_goal_product(env, seed)
        _, reward, _, _ = env.step("click[buy now]")
        assert reward == pytest.approx((n_attr + 1) / (n_attr + n_opt + 1))
        checked += 1
    assert checked >= 3


@needs_data
def test_price_above_limit_costs_the_price_share(make_env):
    env = make_env()
    env.reset(3)
    product = env.catalog.by_asin[env.goal["asin"]]
    full, _ = rw.purchase_reward(product, product.price, env.goal["goal_options"], env.goal)
    over, parts = rw.purchase_reward(
        product, env.goal["price_upper"] + 0.01, env.goal["goal_options"], env.goal
    )
    n = len(env.goal["attributes"]) + len(env.goal["goal_options"]) + 1
    assert full == 1.0 and over == pytest.approx(1.0 - 1.0 / n) and parts["r_price"] == 0.0


# ---------------------------------------------------------------- goals


@needs_data
def test_goals_are_seeded_and_follow_webshop_rules(make_env):
    env_a, env_b = make_env(), make_env()
    assert env_a.catalog is env_b.catalog  # shared read-only, built once
    asins = set()
    for seed in range(30):
        assert env_a.reset(seed) == env_b.reset(seed)
        goal = env_a.goal
        assert goal == env_b.goal
        asins.add(goal["asin"])
        product = env_a.catalog.by_asin[goal["asin"]]
        assert set(goal["goal_options"]) == set(product.options)
        assert all(v in product.options[k] for k, v in goal["goal_options"].items())
        above = [p for p in cat.PRICE_RANGE if p > product.price][:4]
        assert (
            goal["price_upper"] in above[1:] if len(above) >= 2 else goal["price_upper"] == cat.NO_PRICE_LIMIT
        )
        assert goal["instruction"].startswith(
            next(s.instruction for s in env_a.catalog.goal_specs if s.product is product)
        )
        for k, v in goal["goal_options"].items():
            assert f"{k}: {v}" in goal["instruction"]
        if goal["price_upper"] != cat.NO_PRICE_LIMIT:
            assert goal["instruction"].endswith(f"price lower than {goal['price_upper']:.2f} dollars")
    assert len(asins) > 10


@needs_data
def test_goal_weights_match_enumerating_every_webshop_goal(make_env):
    """Reference: WebShop's own construction, one goal per option combination, weight = mean over
    the goal's attributes of 1 / (number of goals with that attribute)."""
    specs = make_env().catalog.goal_specs
    goals = []
    for spec in specs:
        names = sorted(spec.product.options)
        for _ in itertools.product(*(spec.product.options[n] for n in names)):
            goals.append(spec)
    counts = Counter(a for spec in goals for a in spec.attributes)
    expected = Counter()
    for spec in goals:
        expected[spec.product.asin] += sum(1.0 / counts[a] for a in spec.attributes) / len(spec.attributes)
    weights = cat._goal_weights(specs)
    assert len(goals) > len(specs)
    for spec, w in zip(specs, weights):
        assert w == pytest.approx(expected[spec.product.asin], rel=1e-9)


# ---------------------------------------------------------------- sessions


@needs_data
def test_two_agents_on_one_seed_do_not_interfere(make_env):
    script = ["search[easy clean non slip]", "click[next >]", "click[back to search]", "search[leather]"]

    def solo(actions):
        env = make_env()
        observations = [env.reset(5)]
        for action in actions:
            observations.append(env.step(action)[0])
        first = product_actions(env)[0]
        observations.append(env.step(first)[0])
        return observations

    expected = solo(script)
    a, b = make_env(), make_env()
    seen_b = [b.reset(5)]
    a.reset(5)
    a.step("search[pink desk pad]")
    for action in script:
        a.step("click[back to search]")
        a.step("search[something else entirely]")
        seen_b.append(b.step(action)[0])
    seen_b.append(b.step(product_actions(b)[0])[0])
    assert seen_b == expected


# ---------------------------------------------------------------- pages and actions


@needs_data
def test_pages_list_their_actions_and_invalid_actions_change_nothing(make_env):
    env = make_env()
    obs = env.reset(1)
    assert obs.splitlines()[0] == f"Instruction: {env.goal['instruction']}"
    assert obs.endswith("Available actions: search[<keywords>]")
    for bad in ["click[buy now]", "search[]", "buy it", "", "click[", "search[a]]x", "\x00[]"]:
        page = env.render()
        obs, reward, done, info = env.step(bad)
        assert (reward, done, info["action_is_valid"], info["action_is_effective"]) == (
            0.0,
            False,
            False,
            False,
        )
        assert obs.startswith("Invalid action") and obs.endswith(page.splitlines()[-1])
    obs, *_, info = env.step("SEARCH[ Pink   Desk Pad ]")
    assert info["action_is_valid"] and 'results for "pink desk pad"' in obs
    actions = env.available_actions()
    assert "click[back to search]" in actions and "click[< prev]" not in actions
    products = product_actions(env)
    assert 1 <= len(products) <= 10
    assert env.step("search[again]")[3]["action_is_valid"] is False  # no search box on the results
    env.step(products[0])
    for button in ["back to search", "< prev", "description", "features", "reviews", "buy now"]:
        assert f"click[{button}]" in env.available_actions()
    obs, _, _, info = env.step("click[features]")
    assert "Page: features" in obs and env.available_actions() == ["click[back to search]", "click[< prev]"]
    env.step("click[< prev]")
    assert "Page: product" in env.render()
    env.step("click[< prev]")
    assert 'results for "pink desk pad"' in env.render()
    assert env.step("click[back to search]")[0].endswith("search[<keywords>]")


@needs_data
def test_results_paging(make_env):
    env = make_env()
    env.reset(0)
    env.step("search[women shoes dress]")
    seen = []
    for page in range(1, 6):
        rows = [line for line in env.render().splitlines() if re.match(r"\[[A-Z0-9]{10}\] ", line)]
        seen += rows
        assert len(rows) == 10 and f"page {page} of 5" in env.render()
        assert ("click[< prev]" in env.available_actions()) == (page > 1)
        if page < 5:
            env.step("click[next >]")
    assert "click[next >]" not in env.available_actions() and len(set(seen)) == 50
    assert env.step("click[< prev]")[3]["action_is_effective"]
    assert "page 4 of 5" in env.render()


def test_parse_action_never_raises():
    assert parse_action("click[Buy Now]") == ("click", "buy now")
    assert parse_action("  search [ red  shoes ] ") == ("search", "red shoes")
    assert parse_action("click[a [b] c]") == ("click", "a [b] c")
    rng = random.Random(0)
    alphabet = "sc[]lik earh\n\x00é|,"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        parsed = parse_action(text)
        assert parsed is None or parsed[0] in ("search", "click")
    assert parse_action(None) is None


def test_step_before_reset_is_a_clear_error(tmp_path):
    env = WebShopEnv(*_tiny_raw_set(tmp_path), title_parser="plain")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("search[x]")


def test_missing_files_name_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="products_path"):
        WebShopEnv(products_path=str(tmp_path / "nope.json"), goals_path=str(tmp_path / "g.json"))


def test_registered_as_webshop(tmp_path):
    products, goals = _tiny_raw_set(tmp_path)
    env = grl.envs.make("webshop", products_path=products, goals_path=goals, title_parser="plain")
    assert isinstance(env, WebShopEnv) and grl.envs.config_keys("webshop") >= {"products_path", "goals_path"}


# ---------------------------------------------------------------- WebShop's raw file format


def _tiny_raw_set(tmp_path):
    """Three products in WebShop's raw `items_shuffle` layout and their `items_ins_v2` entries."""
    raw = [
        {
            "asin": "B000SHOE01",
            "name": "Trail Running Shoe for Men",
            "full_description": "Light mesh trail shoe.",
            "pricing": "$40.00 - $60.00",
            "small_description": "Rubber sole",
            "category": "fashion",
            "query": "Running Shoes ",
            "product_category": "Clothing › Men › Shoes › Athletic › Running",
            "images": ["x.jpg"],
            "customization_options": {
                "Color": [{"value": "Navy/White", "image": None}, {"value": "Black", "image": None}],
                "Size": [{"value": "9"}, {"value": "10"}],
            },
        },
        {
            "asin": "B000MUG002",
            "name": "Ceramic Coffee Mug",
            "full_description": "A mug.",
            "pricing": "$12.50",
            "small_description": ["Dishwasher safe"],
            "category": "garden",
            "query": "mugs",
            "product_category": "Home › Kitchen › Mugs",
            "images": [],
            "customization_options": "",
        },
        {"asin": "nan", "name": "skipped", "pricing": "", "customization_options": None},
    ]
    goals = {
        "B000SHOE01": {
            "attributes": ["rubber sole", "mesh"],
            "instruction": "i want trail running shoes with a rubber sole",
            "instruction_attributes": ["rubber sole"],
        },
        "B000MUG002": {"attributes": ["dishwasher safe"]},
    }
    (tmp_path / "items.json").write_text(json.dumps(raw))
    (tmp_path / "goals.json").write_text(json.dumps(goals))
    return str(tmp_path / "items.json"), str(tmp_path / "goals.json")


def test_raw_items_shuffle_format(tmp_path):
    env = WebShopEnv(*_tiny_raw_set(tmp_path), title_parser="plain")
    shoe = env.catalog.by_asin["B000SHOE01"]
    assert shoe.options == {"color": ("navy | white", "black"), "size": ("9", "10")}
    assert 40.0 <= shoe.price <= 60.0 and shoe.price_tag == "$40.0 to $60.0"
    assert shoe.query == "running shoes" and shoe.attributes == ("rubber sole", "mesh")
    assert shoe.bullet_points == ("Rubber sole",)
    assert [p.asin for p in env.catalog.products] == ["B000SHOE01", "B000MUG002"]
    assert env.catalog.by_asin["B000MUG002"].price == 12.5
    for seed in range(6):
        env.reset(seed)
        assert env.goal["asin"] == "B000SHOE01" and env.goal["attributes"] == ["rubber sole"]
        env.step("search[trail shoe]")
        env.step("click[b000shoe01]")
        for value in env.goal["goal_options"].values():
            env.step(f"click[{value}]")
        assert env.step("click[buy now]")[1] == 1.0


def test_literal_string_fields_are_parsed_safely(tmp_path):
    product = {
        "asin": "B0LITERAL1",
        "Title": "[2 Pack] Cotton Socks",
        "Description": "Socks.",
        "BulletPoints": "['Soft cotton', 'Warm']",
        "options": "{'size': ['s', 'm']}",
        "pricing": "[5.0, 7.0]",
        "Attributes": "__import__('os').system('false')",
        "query": "socks",
        "product_category": "Clothing › Socks",
        "category": "fashion",
    }
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "B0LITERAL1", "contents": "cotton socks", "product": product}) + "\n")
    (tmp_path / "g.json").write_text(
        json.dumps({"B0LITERAL1": {"instruction": "i need socks", "instruction_attributes": ["cotton"]}})
    )
    env = WebShopEnv(str(path), str(tmp_path / "g.json"), title_parser="plain")
    p = env.catalog.by_asin["B0LITERAL1"]
    assert p.name == "[2 Pack] Cotton Socks" and p.bullet_points == ("Soft cotton", "Warm")
    assert p.options == {"size": ("s", "m")} and 5.0 <= p.price <= 7.0 and p.attributes == ()
    assert p.search_text == "cotton socks"


# ---------------------------------------------------------------- search


@cache
def _slow_bm25_setup():
    searcher = WebShopEnv(str(PRODUCTS), str(GOALS), title_parser="plain").catalog.searcher
    texts = [json.loads(line)["contents"] for line in PRODUCTS.open()]
    return searcher, [searcher.tokenize(t) for t in texts]


def _slow_bm25(query_tokens, docs, k1=cat.BM25_K1, b=cat.BM25_B):
    """Lucene BM25 written out: sum over query tokens of idf * tf / (tf + k1 (1 - b + b dl / avgdl))."""
    n, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    df = Counter(t for d in docs for t in set(d))
    scores = []
    for doc in docs:
        tf, total = Counter(doc), 0.0
        for t in query_tokens:
            if tf[t]:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                total += idf * tf[t] / (tf[t] + k1 * (1 - b + b * len(doc) / avgdl))
        scores.append(total)
    return scores


@needs_data
@pytest.mark.parametrize(
    "query", ["pink desk pad leather", "women's running shoes size 8", "the of and", "zzzqqq"]
)
def test_search_matches_a_slow_bm25_reference(query):
    searcher, docs = _slow_bm25_setup()
    expected = _slow_bm25(searcher.tokenize(query), docs)
    got = searcher.scores(query)
    assert got.tolist() == pytest.approx(expected, rel=1e-4, abs=1e-5)
    hits = searcher.search(query, 50)
    ranked = sorted((i for i, s in enumerate(expected) if s > 1e-6), key=lambda i: (-expected[i], i))
    assert len(hits) == min(50, len(ranked))
    assert [round(expected[i], 3) for i in hits] == [round(expected[i], 3) for i in ranked[: len(hits)]]


# ---------------------------------------------------------------- reward pieces


def _lcs_reference(a, b):
    @cache
    def go(i, j):
        if i == len(a) or j == len(b):
            return 0
        return go(i + 1, j + 1) + 1 if a[i] == b[j] else max(go(i + 1, j), go(i, j + 1))

    return go(0, 0)


def test_lcs_matches_reference():
    rng = random.Random(1)
    for _ in range(300):
        a = "".join(rng.choice("abc ") for _ in range(rng.randrange(9)))
        b = "".join(rng.choice("abc ") for _ in range(rng.randrange(9)))
        assert rw._lcs_length(a, b) == _lcs_reference(a, b)


def test_token_set_ratio_values():
    assert rw.token_set_ratio("fuzzy was a bear", "fuzzy fuzzy was a bear") == 100
    assert rw.token_set_ratio("New York Mets", "new york meats") == 96  # 200 * 13 / 27
    assert rw.token_set_ratio("X-Large", "x large") == 100
    assert rw.token_set_ratio("", "anything") == 0 and rw.token_set_ratio("!!", "a") == 0
    assert rw.token_set_ratio("blue", "red") == 29  # no shared token: ratio of the two strings, 200 * 1 / 7
    assert rw.fuzzy_match("rubber sole", "Rubber Sole!") and not rw.fuzzy_match("small", "medium")


def test_normalize_color_takes_the_first_base_colour():
    assert rw.normalize_color("light blue") == "blue"  # 'blue' comes before 'light' in WebShop's list
    assert rw.normalize_color("navy") == "navy" and rw.normalize_color("x-large") == "x-large"


def test_type_reward_with_the_plain_title_parser():
    shoe = cat.Product(
        "A",
        "Trail Running Shoe",
        "running shoes",
        "fashion",
        "Clothing › Men › Shoes",
        "",
        (),
        (),
        "",
        "$1",
        1.0,
        {},
        (),
        "",
    )
    mug = cat.Product(
        "B",
        "Ceramic Coffee Mug",
        "mugs",
        "garden",
        "Home › Kitchen › Mugs",
        "",
        (),
        (),
        "",
        "$1",
        1.0,
        {},
        (),
        "",
    )
    goal = {
        "name": "Trail Running Shoe",
        "query": "running shoes",
        "product_category": "Clothing › Men › Shoes",
    }
    assert rw.type_reward(shoe, goal, rw.plain_nouns)["r_type"] == 1.0
    assert rw.type_reward(mug, goal, rw.plain_nouns)["r_type"] == 0.0
    assert rw.plain_nouns("The Shoe for a Man") == ["shoe", "man"]


def test_title_parser_choices(tmp_path):
    paths = _tiny_raw_set(tmp_path)
    assert WebShopEnv(*paths, title_parser="auto").title_parser in ("spacy", "plain")
    with pytest.raises(ValueError, match="title_parser"):
        WebShopEnv(*paths, title_parser="bert")
    if not rw.spacy_available():
        with pytest.raises(ValueError, match="spacy"):
            WebShopEnv(*paths, title_parser="spacy")


# ---------------------------------------------------------------- scripts/install_dataset.sh (offline checks)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install_dataset.sh"


def run_script(*args, env=None):
    import os
    import subprocess

    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_install_script_arguments():
    shown = run_script("--help")
    assert shown.returncode == 0 and "--webshop" in shown.stdout and "items_ins_v2_1000.json" in shown.stdout
    assert run_script().returncode == 2 and "nothing to install" in run_script().stderr
    wrong = run_script("--webshopp")
    assert wrong.returncode == 2 and "unknown argument: --webshopp" in wrong.stderr


def test_install_script_says_what_it_could_not_fetch(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<!DOCTYPE html><html>quota exceeded</html>")
    done = run_script(
        "--webshop",
        "--small",
        "--data-dir",
        str(tmp_path / "data"),
        env={
            "GRL_WEBSHOP_SMALL_ITEMS_URL": "file:///nonexistent/items.json",
            "GRL_WEBSHOP_SMALL_ATTRS_URL": page.as_uri(),
        },
    )
    assert done.returncode == 1
    assert "Could not fetch 2 item(s)" in done.stderr
    assert "items_shuffle_1000.json from file:///nonexistent/items.json (download error)" in done.stderr
    assert "items_ins_v2_1000.json" in done.stderr and "not JSON" in done.stderr
    assert not (tmp_path / "data").exists()  # no partial file, and no folder the failed install made


def test_install_script_webshop_layout_feeds_the_env(tmp_path):
    items, goals = _tiny_raw_set(tmp_path)
    data = tmp_path / "data"
    done = run_script(
        "--webshop",
        "--small",
        "--data-dir",
        str(data),
        env={
            "GRL_WEBSHOP_SMALL_ITEMS_URL": Path(items).as_uri(),
            "GRL_WEBSHOP_SMALL_ATTRS_URL": Path(goals).as_uri(),
        },
    )
    assert done.returncode == 0, done.stderr
    env = WebShopEnv(
        str(data / "webshop" / "items_shuffle_1000.json"), str(data / "webshop" / "items_ins_v2_1000.json")
    )
    env.reset(0)
    assert env.goal["asin"] == "B000SHOE01"


# ---------------------------------------------------------------- the task instance of configs/agents.yaml


@needs_data
def test_webshop_task_instance_buys_with_several_actions_per_reply():
    from omegaconf import OmegaConf

    import grl.agents

    blocks = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs" / "agents.yaml")
    block = OmegaConf.to_container(blocks["webshopAgent"], resolve=True)
    block["env_config"].update(products_path=str(PRODUCTS), goals_path=str(GOALS), title_parser="plain")
    agent = grl.agents.make_agent("webshopAgent", block)
    agent.reset(0)
    goal = agent.env.goal
    options = " || ".join(f"click[{v}]" for v in goal["goal_options"].values())
    first = agent.step(
        f"<think>t</think><answer>search[{goal['name']}] || click[{goal['asin']}] || {options}</answer>"
    )
    assert not first.done and "(chosen)" in agent.messages[-1]["content"]
    last = agent.step("<think>t</think><answer>click[buy now]</answer>")
    assert (last.reward, last.done) == (1.0, True)
    assert agent.episode_metrics()["purchased"] == 1.0


@needs_data
def test_a_search_without_hits_offers_the_way_back(make_env):
    env = make_env()
    env.reset(0)
    obs, _, _, info = env.step("search[zzzqqq xxyyzz]")
    assert info["action_is_valid"] and "No product matches" in obs
    assert env.available_actions() == ["click[back to search]"]
