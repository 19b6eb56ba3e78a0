"""WebShop (`webshop`): buy the product an instruction asks for, in a text-only web shop.

The task of Yao et al. (2022), "WebShop: Towards Scalable Real-World Web Interaction with Grounded
Language Agents", rewritten for GRL: no web server, no Java, no spaCy needed.

Data (`env_config`)
    products_path   products, JSON lines as in WebShop's search-engine documents (`id`, `contents`,
                    `product`) or WebShop's raw `items_shuffle*.json` (a JSON array of products).
                    Nested fields stored as Python-literal strings are parsed with `ast.literal_eval`.
                    Default `data/webshop/items_shuffle_1000.json` (`scripts/install_dataset.sh --webshop`).
    goals_path      `items_ins_v2*.json`: per ASIN, `attributes` and, for goal products,
                    `instruction` and `instruction_attributes`. Default `data/webshop/items_ins_v2_1000.json`.
    search_top_k    products a search returns (WebShop: 50); results_per_page: 10.
    max_text_chars  description / features / reviews pages are cut to this many characters.
    title_parser    `auto` (spaCy's en_core_web_sm if installed, else plain), `spacy` or `plain`:
                    how the type reward finds the nouns of product titles.
    A relative path is looked up in the working directory, then in the repository root. The
    products, their BM25 index and the goal pool are built once per file pair and shared read-only
    by every env of the process; each env holds its own session.

Goals
    `reset(seed)` draws a goal with `random.Random(seed)` as WebShop draws synthetic goals: a goal
    product with probability proportional to (its number of option combinations) x (mean rarity
    of its instruction attributes), one value per option, and a price limit (`price_upper`): the
    larger of two of the four multiples of 10 above the product's price (no limit, 1e6, if fewer
    than two). A product with a price range costs a uniform draw from the range, seeded by its
    ASIN. The instruction reads "<instruction> with <option>: <value>, and ..., and price lower
    than <limit> dollars". `env.goal` holds `asin`, `instruction`, `attributes`
    (the instruction attributes), `goal_options` (option name -> value), `price_upper`, and the
    product's `name`, `query`, `category`, `product_category`.

Pages and actions (every observation starts with the instruction and ends with
"Available actions: ..."; action names and arguments are case-insensitive)
    search    `search[<keywords>]`: BM25 (bm25s, Lucene variant, k1=0.9, b=0.4, English stop words,
              Snowball stemming) over each product's title, description, first bullet point and
              options; only products with a positive score are listed.
    results   10 per page as `[ASIN] title | price`; `click[<asin>]`, `click[next >]`,
              `click[< prev]`, `click[back to search]`.
    item      title, price, rating and each option's values (the chosen one marked);
              `click[<option value>]` chooses a value, `click[description]`, `click[features]`,
              `click[reviews]`, `click[buy now]`, `click[< prev]` (back to the results),
              `click[back to search]`.
    detail    the description, features or reviews; `click[< prev]`, `click[back to search]`.
    done      after `click[buy now]`; the episode ends.
    `env.available_actions()` returns the same list. An action that is not available on the page
    changes nothing (reward 0, `action_is_valid` False) and the observation repeats the page after
    an "Invalid action" line.

Reward
    0 until `click[buy now]`, then WebShop's purchase reward in [0, 1] (`grl.envs.webshop.reward`):
    r_type x (matched attributes + matched options + [price <= price_upper]) / (attributes + options + 1).
    `success` is reward 1.0; `info["purchased"]` tells whether anything was bought (the purchase
    rate is its mean); the buying step's info also has `reward_parts`.
"""

from grl.envs.webshop.env import WebShopEnv, parse_action

__all__ = ["WebShopEnv", "parse_action"]
