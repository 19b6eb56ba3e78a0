"""BIRD env on a real SQLite database and its 88 gold queries (../shared/data/text2sql), laid out
by the tests in BIRD's layout: {db_root}/{db_id}/{db_id}.sqlite plus a JSON-lines question file."""

import hashlib
import json
import os
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

import grl.envs
from grl.envs.bird import BirdEnv, extract_sql

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "text2sql"
DB_FILE, GOLD_FILE = DATA / "department_store.sqlite", DATA / "department_store_gold.sql"
pytestmark = pytest.mark.shared_data("text2sql/department_store.sqlite", "text2sql/department_store_gold.sql")


def gold_queries() -> list[str]:
    return [line.split("\t")[0] for line in GOLD_FILE.read_text().splitlines() if line.strip()]


def write_bird_layout(root: Path, split: str = "train", records=None) -> tuple[Path, Path]:
    """{root}/{split}.jsonl and {root}/{split}_databases/department_store/department_store.sqlite."""
    db_dir = root / f"{split}_databases" / "department_store"
    db_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DB_FILE, db_dir / "department_store.sqlite")
    if records is None:
        records = [
            {
                "question": f"Gold question {i}",
                "SQL": sql,
                "db_id": "department_store",
                "evidence": f"hint {i}" if i % 2 else "",
            }
            for i, sql in enumerate(gold_queries())
        ]
    dataset = root / f"{split}.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in records))
    return dataset, root / f"{split}_databases"


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    return write_bird_layout(tmp_path_factory.mktemp("bird"))


def fenced(sql: str) -> str:
    return f"Here is my query.\n```sql\n{sql}\n```"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- rewards on the gold queries


def test_every_gold_query_gets_reward_one_and_seeds_cover_the_dataset(layout):
    env = BirdEnv(*map(str, layout))
    seen = set()
    for seed in range(88):
        obs = env.reset(seed)
        seen.add(env.question["question"])
        assert f"Question: {env.question['question']}" in obs and "CREATE TABLE `Products`" in obs
        assert ("Evidence: hint" in obs) == bool(env.question["evidence"])
        obs, reward, done, info = env.step(fenced(env.question["SQL"]))
        assert (reward, done, info["success"], info["action_is_valid"]) == (1.0, True, True, True), (
            env.question
        )
    assert len(seen) == 88
    env.close()


def test_changed_queries_do_not_match_and_row_order_does_not_matter(layout):
    env = BirdEnv(*map(str, layout))
    for seed in range(0, 88, 2):  # the file holds every query twice
        env.reset(seed)
        gold = env.question["SQL"].strip().rstrip(";")
        changes = [
            f"SELECT * FROM ({gold}) UNION ALL SELECT * FROM ({gold})",  # every row twice
            f"SELECT * FROM ({gold}) LIMIT (SELECT count(*) FROM ({gold})) - 1",  # one row fewer
        ]
        for changed in changes:
            env.reset(seed)
            _, reward, done, info = env.step(fenced(changed))
            assert (reward, done, info["success"], info["action_is_effective"]) == (0.0, True, False, True), (
                changed
            )
        env.reset(seed)
        assert env.step(fenced(f"SELECT * FROM ({gold}) ORDER BY 1 DESC;"))[1] == 1.0


def test_concatenation_operator_survives(layout):
    records = [
        {
            "question": "names",
            "SQL": "SELECT product_name || ' - ' || product_type_code FROM Products",
            "db_id": "department_store",
        }
    ]
    dataset, db_root = write_bird_layout(layout[0].parent / "concat", records=records)
    env = BirdEnv(str(dataset), str(db_root))
    env.reset(0)
    answer = (
        "```sql\nSELECT product_name||' - '||product_type_code FROM Products ORDER BY product_id DESC\n```"
    )
    assert extract_sql(answer).count("||") == 2
    assert env.step(answer)[1] == 1.0


# ---------------------------------------------------------------- turns and penalties


def test_single_turn_no_fence_is_penalised_and_ends(layout):
    env = BirdEnv(*map(str, layout))
    env.reset(0)
    obs, reward, done, info = env.step("SELECT count(*) FROM Products")
    assert (reward, done, info["action_is_valid"]) == (-0.5, True, False) and "No tries left" in obs
    env = BirdEnv(*map(str, layout), no_fence_penalty=-0.1)
    env.reset(0)
    assert env.step("no sql here")[1] == -0.1


def test_multi_turn_feedback_and_halved_reward(layout):
    env = BirdEnv(*map(str, layout), max_tries=5)
    env.reset(3)
    obs, reward, done, info = env.step(fenced("SELECT nope FROM Products"))
    assert (reward, done, info["action_is_effective"]) == (0.0, False, False)
    assert "no such column: nope" in obs and "4 tries left" in obs
    obs, reward, done, _ = env.step(fenced("SELECT 42"))
    assert (reward, done) == (0.0, False) and "It returned 1 row: (42,)" in obs and "3 tries left" in obs
    obs, reward, done, _ = env.step("I think the answer is obvious.")
    assert (reward, done) == (-0.5, False) and "no ```sql" in obs
    obs, reward, done, info = env.step(fenced(env.question["SQL"]))
    assert (reward, done, info["success"], info["tries"]) == (0.125, True, True, 4)
    assert env.step(fenced(env.question["SQL"]))[1:3] == (0.0, True)  # the episode is over


def test_multi_turn_ends_after_max_tries(layout):
    env = BirdEnv(*map(str, layout), max_tries=3)
    env.reset(7)
    results = [env.step(fenced("SELECT 1")) for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True] and "No tries left" in results[-1][0]


# ---------------------------------------------------------------- sandbox


HOSTILE = [
    "DROP TABLE Products",
    "INSERT INTO Products VALUES (999, 'x', 'y', 1.0)",
    "UPDATE Products SET product_price = 0",
    "DELETE FROM Products",
    "CREATE TABLE evil (x)",
    "CREATE TEMP TABLE evil (x)",
    "ALTER TABLE Products ADD COLUMN evil TEXT",
    "ATTACH DATABASE '{attach}' AS evil",
    "VACUUM INTO '{attach}'",
    "VACUUM",
    "PRAGMA query_only = OFF",
    "PRAGMA writable_schema = ON",
    "PRAGMA journal_mode = WAL",
    "PRAGMA user_version = 7",
    "BEGIN IMMEDIATE",
    "SELECT 1; DELETE FROM Products",
    "SELECT load_extension('/tmp/evil.so')",
    "REINDEX",
    "ANALYZE",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
    "SELECT count(*) FROM Products a, Products b, Products c, Products d, Products e, Products f, Products g",
    "SELECT * FROM Order_Items a, Order_Items b, Order_Items c, Order_Items d",
    "SELECT randomblob(2000000000)",
]


def step_or_hang(env, answer, limit_s):
    """env.step in a daemon thread: a query that ignores the time limit fails the test, not the run.
    The bound is far above the 1 s limit: it only tells a stop from a hang."""
    import threading

    out = []
    worker = threading.Thread(target=lambda: out.append(env.step(answer)), daemon=True)
    worker.start()
    worker.join(limit_s)
    assert out, f"no answer within {limit_s} s: {answer!r}"
    return out[0]


def test_hostile_sql_leaves_the_database_unchanged_and_returns_in_time(tmp_path):
    dataset, db_root = write_bird_layout(tmp_path)
    db_file = db_root / "department_store" / "department_store.sqlite"
    before, files_before = sha256(db_file), sorted(os.listdir(db_file.parent))
    attach = tmp_path / "attached.sqlite"
    env = BirdEnv(
        str(dataset), str(db_root), max_tries=len(HOSTILE) + 1, step_timeout_seconds=1.0, max_rows=50_000
    )
    env.reset(0)
    for sql in HOSTILE:
        obs, reward, done, info = step_or_hang(env, fenced(sql.format(attach=attach)), limit_s=8.0)
        assert reward == 0.0 and not done and not info["action_is_effective"], (sql, obs)
        assert "Your query failed" in obs
    assert sha256(db_file) == before and sorted(os.listdir(db_file.parent)) == files_before
    assert not attach.exists()
    # the connection still answers after all that
    _, reward, done, _ = env.step(fenced(env.question["SQL"]))
    assert (reward, done) == (0.5 ** len(HOSTILE), True)
    assert sha256(db_file) == before


def test_endless_queries_report_a_timeout(tmp_path):
    env = BirdEnv(*map(str, write_bird_layout(tmp_path)), step_timeout_seconds=0.5)
    env.reset(0)
    obs, _, _, info = env.step(fenced(HOSTILE[19]))
    assert info["timed_out"] and "time limit of 0.5 s" in obs


def test_row_cap(tmp_path):
    env = BirdEnv(*map(str, write_bird_layout(tmp_path)), max_rows=100)
    env.reset(0)
    obs, _, _, info = env.step(fenced("SELECT * FROM Products a, Products b"))  # 225 rows
    assert "more than 100 rows" in obs and not info["timed_out"]


def test_agents_have_their_own_connections(layout):
    a, b = BirdEnv(*map(str, layout), max_tries=2), BirdEnv(*map(str, layout), max_tries=2)
    a.reset(11), b.reset(11)
    assert a._sandbox is not b._sandbox and a.question is b.question
    a.step(fenced("SELECT 1"))
    assert b.step(fenced(b.question["SQL"]))[1] == 1.0 and a.tries == 1
    a.close()
    assert b.reset(12) and b.step(fenced(b.question["SQL"]))[1] == 1.0


# ---------------------------------------------------------------- dataset loading


def test_schema_and_evidence_from_the_record_and_split_paths(tmp_path):
    records = [
        {
            "question": "How many products?",
            "SQL": "SELECT count(*) FROM Products",
            "db_id": "department_store",
            "evidence": "products are in Products",
            "schema": "CREATE TABLE Products (product_id INT);",
        }
    ]
    write_bird_layout(tmp_path, split="dev", records=records)
    env = BirdEnv(
        dataset_path=str(tmp_path / "{split}.jsonl"), db_root=str(tmp_path / "{split}_databases"), split="dev"
    )
    obs = env.reset(0)
    assert "CREATE TABLE Products (product_id INT);" in obs and "`Customers`" not in obs
    assert obs.endswith("Question: How many products?\nEvidence: products are in Products")


def test_bird_json_array_file(tmp_path):
    dataset, db_root = write_bird_layout(tmp_path)
    array = tmp_path / "train.json"
    array.write_text(json.dumps([json.loads(line) for line in dataset.read_text().splitlines()]))
    env = BirdEnv(str(array), str(db_root))
    env.reset(5)
    assert env.step(fenced(env.question["SQL"]))[1] == 1.0


def test_missing_files_fail_with_clear_errors(tmp_path):
    dataset, db_root = write_bird_layout(tmp_path)
    with pytest.raises(FileNotFoundError, match="dataset_path .*nope.jsonl"):
        BirdEnv(str(tmp_path / "nope.jsonl"), str(db_root))
    with pytest.raises(FileNotFoundError, match="db_root"):
        BirdEnv(str(dataset), str(tmp_path / "no_dbs"))
    missing_db = tmp_path / "missing.jsonl"
    missing_db.write_text(json.dumps({"question": "q", "SQL": "SELECT 1", "db_id": "ghost"}) + "\n")
    env = BirdEnv(str(missing_db), str(db_root))
    with pytest.raises(FileNotFoundError, match="ghost"):
        env.reset(0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "db_id": "department_store"}) + "\n")
    with pytest.raises(ValueError, match="record 0 lacks SQL"):
        BirdEnv(str(bad), str(db_root))
    with pytest.raises(RuntimeError, match="reset"):
        BirdEnv(str(dataset), str(db_root)).step("```sql SELECT 1```")


def test_hub_style_dataset_folder_through_datasets(tmp_path):
    dataset, db_root = write_bird_layout(tmp_path)
    folder = tmp_path / "hub_copy"
    folder.mkdir()
    shutil.copyfile(dataset, folder / "train.jsonl")
    env = BirdEnv(str(folder), str(db_root), split="train")
    assert len(env.records) == 88
    env.reset(2)
    assert env.step(fenced(env.question["SQL"]))[1] == 1.0


def test_registered_as_bird(layout):
    env = grl.envs.make("bird", dataset_path=str(layout[0]), db_root=str(layout[1]))
    assert isinstance(env, BirdEnv) and {"step_timeout_seconds", "max_tries"} <= grl.envs.config_keys("bird")


def test_extract_sql_never_raises():
    assert extract_sql("```SQL\nSELECT 1;\n```") == "SELECT 1;"
    assert extract_sql("```sql a``` then ```sql b```") == "a"
    assert extract_sql("```python\nprint()\n```") is None and extract_sql(None) is None
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("`sqlSQL \n|;x\x00") for _ in range(rng.randrange(20)))
        result = extract_sql(text)
        assert result is None or isinstance(result, str)


def test_each_layer_alone_refuses_writes(tmp_path):
    dataset, db_root = write_bird_layout(tmp_path)
    db_file = db_root / "department_store" / "department_store.sqlite"
    before = sha256(db_file)
    env = BirdEnv(str(dataset), str(db_root))
    env.reset(0)
    conn = env._sandbox._conn
    conn.set_authorizer(None)  # without the authorizer, PRAGMA query_only refuses
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM Products")
    conn.execute("PRAGMA query_only = OFF")  # without query_only too, the mode=ro connection refuses
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM Products")
    env.close()
    assert sha256(db_file) == before


# ---------------------------------------------------------------- scripts/install_dataset.sh --bird (offline)


def _bird_style_archive(path: Path, top: str, split: str, records) -> None:
    """An archive laid out like BIRD's: {top}/{split}.json and a nested {split}_databases.zip."""
    import zipfile

    inner = path.parent / f"{split}_databases.zip"
    with zipfile.ZipFile(inner, "w") as z:
        z.write(DB_FILE, f"{split}_databases/department_store/department_store.sqlite")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{top}/{split}.json", json.dumps(records))
        z.write(inner, f"{top}/{split}_databases.zip")


def test_install_script_bird_layout_feeds_the_env(tmp_path):
    import subprocess

    records = [
        {"question_id": i, "db_id": "department_store", "question": f"q{i}", "evidence": "", "SQL": sql}
        for i, sql in enumerate(gold_queries()[:6])
    ]
    _bird_style_archive(tmp_path / "train.zip", "train", "train", records)
    _bird_style_archive(tmp_path / "dev.zip", "dev_20240627", "dev", records[:2])
    script = Path(__file__).resolve().parents[2] / "scripts" / "install_dataset.sh"
    data = tmp_path / "data"
    env_vars = {
        **os.environ,
        "GRL_BIRD_TRAIN_URL": (tmp_path / "train.zip").as_uri(),
        "GRL_BIRD_DEV_URL": (tmp_path / "dev.zip").as_uri(),
    }
    done = subprocess.run(
        ["bash", str(script), "--bird", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_vars,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "BIRD train: 6 questions, 1 databases" in done.stdout
    for split, n in (("train", 6), ("dev", 2)):
        env = BirdEnv(
            str(data / "bird" / "{split}.jsonl"), str(data / "bird" / "{split}_databases"), split=split
        )
        assert len(env.records) == n
        env.reset(1)
        assert env.step(fenced(env.question["SQL"]))[1] == 1.0
    failed = subprocess.run(
        ["bash", str(script), "--bird", "--small", "--data-dir", str(tmp_path / "d2")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "GRL_BIRD_MINIDEV_URL": "file:///nonexistent/minidev.zip"},
    )
    assert failed.returncode == 1 and "BIRD minidev from file:///nonexistent/minidev.zip" in failed.stderr


# ---------------------------------------------------------------- the task instances of configs/agents.yaml


def task_block(name: str, **env_config) -> dict:
    from omegaconf import OmegaConf

    blocks = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs" / "agents.yaml")
    block = OmegaConf.to_container(blocks[name], resolve=True)
    block["env_config"].update(env_config)
    return block


def test_bird_task_instances_pass_sql_with_concatenation_whole(tmp_path):
    import grl.agents

    records = [
        {
            "question": "names",
            "SQL": "SELECT product_name || ' - ' || product_type_code FROM Products",
            "db_id": "department_store",
        }
    ]
    dataset, db_root = write_bird_layout(tmp_path, records=records)
    paths = {"dataset_path": str(dataset), "db_root": str(db_root)}
    reply = (
        "<think>join with ||</think><answer>```sql\nSELECT product_name || ' - ' || product_type_code FROM "
        "Products\n```</answer>"
    )

    single = grl.agents.make_agent("birdAgent", task_block("birdAgent", **paths))
    single.reset(0)
    step = single.step(reply)
    assert (step.reward, step.done, step.info["success"]) == (1.0, True, True)

    multi = grl.agents.make_agent("birdAgent_5_turns", task_block("birdAgent_5_turns", **paths))
    multi.reset(0)
    first = multi.step("<think>t</think><answer>```sql\nSELECT product_name FROM Products\n```</answer>")
    assert not first.done and "does not match" in multi.messages[-1]["content"]
    second = multi.step(reply)
    assert (second.reward, second.done) == (0.5, True)
