#!/usr/bin/env bash
# Download GRL's task data from the datasets' usual public sources into the layout the configs use.
#
#   scripts/install_dataset.sh --webshop | --bird | --gsm8k | --math | --all  [--small] [--data-dir DIR]
#
# Layout (DIR defaults to $GRL_DATA_DIR, else data/ in the repository root; configs/agents.yaml
# reads ${oc.env:GRL_DATA_DIR,data}/...):
#   DIR/webshop/items_shuffle_1000.json, items_ins_v2_1000.json   WebShop small set (1,000 products)
#   DIR/webshop/items_shuffle.json, items_ins_v2.json             WebShop full set (~1.18M products)
#   DIR/bird/{train,dev}.jsonl                                    BIRD questions, one JSON object a line
#   DIR/bird/{train,dev}_databases/{db_id}/{db_id}.sqlite         BIRD databases
#   DIR/bird/minidev.jsonl, minidev_databases/...                 BIRD mini-dev (with --small)
#   DIR/gsm8k/{train,test}.jsonl                                  GSM8K (`problem`, `answer`, `solution`)
#   DIR/math/{math500,aime24,aime25,amc23,minervamath}/test.jsonl  competition math (`problem`, `answer`, ...)
#
# --small: WebShop small set only, and BIRD mini-dev instead of train + dev.
# Sources (each can be overridden by the environment variable named beside it):
#   WebShop: the Google Drive files of princeton-nlp/WebShop's setup.sh
#     GRL_WEBSHOP_SMALL_ITEMS_URL, GRL_WEBSHOP_SMALL_ATTRS_URL, GRL_WEBSHOP_FULL_ITEMS_URL, GRL_WEBSHOP_FULL_ATTRS_URL
#   BIRD: https://bird-bench.github.io archives   GRL_BIRD_TRAIN_URL, GRL_BIRD_DEV_URL, GRL_BIRD_MINIDEV_URL
#   GSM8K: the Hugging Face dataset openai/gsm8k (config main) through `datasets`   GRL_GSM8K_DATASET
#   Math (Hugging Face datasets, split test): HuggingFaceH4/MATH-500, math-ai/aime24, math-ai/aime25,
#     math-ai/amc23, math-ai/minervamath   GRL_MATH500_DATASET, GRL_AIME24_DATASET, GRL_AIME25_DATASET,
#     GRL_AMC23_DATASET, GRL_MINERVAMATH_DATASET
# PYTHON picks the interpreter (default: the repository's .venv, else python3).
# The script reports every file it could not fetch and exits 1 if there was any.

set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA_DIR="${GRL_DATA_DIR:-$REPO_ROOT/data}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

gdrive() { echo "https://drive.usercontent.google.com/download?id=$1&export=download&confirm=t"; }
WEBSHOP_SMALL_ITEMS_URL="${GRL_WEBSHOP_SMALL_ITEMS_URL:-$(gdrive 1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib)}"
WEBSHOP_SMALL_ATTRS_URL="${GRL_WEBSHOP_SMALL_ATTRS_URL:-$(gdrive 1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu)}"
WEBSHOP_FULL_ITEMS_URL="${GRL_WEBSHOP_FULL_ITEMS_URL:-$(gdrive 1A2whVgOO0euk5O13n2iYDM0bQRkkRduB)}"
WEBSHOP_FULL_ATTRS_URL="${GRL_WEBSHOP_FULL_ATTRS_URL:-$(gdrive 1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi)}"
BIRD_TRAIN_URL="${GRL_BIRD_TRAIN_URL:-https://bird-bench.oss-cn-beijing.aliyuncs.com/train.zip}"
BIRD_DEV_URL="${GRL_BIRD_DEV_URL:-https://bird-bench.oss-cn-beijing.aliyuncs.com/dev.zip}"
BIRD_MINIDEV_URL="${GRL_BIRD_MINIDEV_URL:-https://bird-bench.oss-cn-beijing.aliyuncs.com/minidev.zip}"
GSM8K_DATASET="${GRL_GSM8K_DATASET:-openai/gsm8k}"
MATH_SETS=(math500 aime24 aime25 amc23 minervamath)
declare -A MATH_DATASET=(
  [math500]="${GRL_MATH500_DATASET:-HuggingFaceH4/MATH-500}"
  [aime24]="${GRL_AIME24_DATASET:-math-ai/aime24}"
  [aime25]="${GRL_AIME25_DATASET:-math-ai/aime25}"
  [amc23]="${GRL_AMC23_DATASET:-math-ai/amc23}"
  [minervamath]="${GRL_MINERVAMATH_DATASET:-math-ai/minervamath}"
)

usage() {  # the comment block at the top of this file
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
}

FAILED=()
fail() { echo "FAILED: $1" >&2; FAILED+=("$1"); }

# download URL DEST: fetch to a temporary name, move into place only when complete
download() {
  local url="$1" dest="$2"
  mkdir -p "$(dirname "$dest")"
  echo "fetching $url"
  if command -v curl >/dev/null; then
    curl -fL --retry 2 --connect-timeout 20 -sS -o "$dest.part" "$url"
  else
    wget -q --tries=3 --timeout=20 -O "$dest.part" "$url"
  fi || { rm -f "$dest.part"; return 1; }
  mv "$dest.part" "$dest"
}

# fetch_json URL DEST: a JSON file (Google Drive answers an HTML page when it refuses)
fetch_json() {
  local url="$1" dest="$2"
  if [[ -s "$dest" ]]; then echo "have $dest"; return 0; fi
  if ! download "$url" "$dest"; then fail "$(basename "$dest") from $url (download error)"; return 1; fi
  if ! head -c 512 "$dest" | tr -d ' \t\r\n' | grep -q '^[[{]'; then
    rm -f "$dest"; fail "$(basename "$dest") from $url (not JSON: the server sent a web page; download it by hand into $(dirname "$dest"))"
    return 1
  fi
}

install_webshop() {
  local dir="$DATA_DIR/webshop"
  fetch_json "$WEBSHOP_SMALL_ITEMS_URL" "$dir/items_shuffle_1000.json"
  fetch_json "$WEBSHOP_SMALL_ATTRS_URL" "$dir/items_ins_v2_1000.json"
  if [[ "$SMALL" == 0 ]]; then
    fetch_json "$WEBSHOP_FULL_ITEMS_URL" "$dir/items_shuffle.json"
    fetch_json "$WEBSHOP_FULL_ATTRS_URL" "$dir/items_ins_v2.json"
  fi
}

# bird_split NAME URL: DIR/bird/NAME.jsonl and DIR/bird/NAME_databases/ from a BIRD archive
bird_split() {
  local name="$1" url="$2" dir="$DATA_DIR/bird"
  if [[ -s "$dir/$name.jsonl" && -d "$dir/${name}_databases" ]]; then echo "have BIRD $name"; return 0; fi
  local work="$dir/.download_$name"
  mkdir -p "$work"
  if ! download "$url" "$work/archive.zip"; then
    rm -rf "$work"; fail "BIRD $name from $url (download error; by hand: unpack it into $dir)"; return 1
  fi
  if ! "$PYTHON" - "$work" "$dir" "$name" <<'PY'
import json, shutil, sys, zipfile
from pathlib import Path

# a broken archive (a web page saved as .zip, a truncated download) is one line, not a traceback
sys.excepthook = lambda kind, err, tb: print(f"  BIRD {sys.argv[3]}: {kind.__name__}: {err}", file=sys.stderr)
work, out, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
zipfile.ZipFile(work / "archive.zip").extractall(work / "x")
# BIRD nests its databases in a second archive (train_databases.zip, dev_databases.zip)
for inner in sorted((work / "x").rglob("*_databases.zip")):
    zipfile.ZipFile(inner).extractall(inner.parent)
questions = [p for p in (work / "x").rglob("*.json")
             if "__MACOSX" not in p.parts and p.name in ("train.json", "dev.json", "mini_dev_sqlite.json")]
if not questions:
    sys.exit(f"no train.json / dev.json / mini_dev_sqlite.json in the {name} archive")
rows = json.loads(questions[0].read_text(encoding="utf-8"))
with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
    for row in rows:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
databases = out / f"{name}_databases"
databases.mkdir(parents=True, exist_ok=True)
count = 0
for db in sorted((work / "x").rglob("*.sqlite")):  # listed before anything moves
    if "__MACOSX" in db.parts or db.stem != db.parent.name:
        continue
    target = databases / db.stem
    if not target.exists():
        shutil.move(str(db.parent), str(target))
    count += 1
if count == 0:
    sys.exit(f"no {{db_id}}/{{db_id}}.sqlite databases in the {name} archive")
print(f"BIRD {name}: {len(rows)} questions, {count} databases")
PY
  then
    rm -rf "$work"; rm -f "$dir/$name.jsonl"; rmdir "$dir/${name}_databases" 2>/dev/null
    fail "BIRD $name from $url (archive not in BIRD's layout; by hand: unpack it into $dir)"; return 1
  fi
  rm -rf "$work"
}

install_bird() {
  if [[ "$SMALL" == 1 ]]; then
    bird_split minidev "$BIRD_MINIDEV_URL"
  else
    bird_split train "$BIRD_TRAIN_URL"
    bird_split dev "$BIRD_DEV_URL"
  fi
}

# hub_to_jsonl KIND CONFIG SPLIT  LABEL HUB_ID DEST  [LABEL HUB_ID DEST ...]: hub datasets as GRL's JSONL
# layout, in one Python process; each file is written under a temporary name and moved into place only when
# complete. A set that fails is one line (no traceback) and leaves no file or empty folder behind.
hub_to_jsonl() {
  local kind="$1" config="$2" split="$3"; shift 3
  local label hub_id dest reason got=0
  while IFS=$'\t' read -r label hub_id dest reason; do
    got=1
    fail "$label from the Hugging Face dataset $hub_id ($reason; by hand: save its $split split as JSON lines with \`problem\` and \`answer\` to $dest)"
  done < <(PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$kind" "$config" "$split" "$@" <<'PY' || echo "all	$kind	$DATA_DIR	$PYTHON could not run the converter"
import json, os, sys

kind, config, split, items = sys.argv[1], sys.argv[2] or None, sys.argv[3], sys.argv[4:]
for label, hub_id, dest in zip(items[0::3], items[1::3], items[2::3]):
    try:
        from datasets import load_dataset
        if kind == "gsm8k":
            from grl.envs.gsm8k import gold_answer

            def convert(row, where):  # GRL's layout keeps GSM8K's worked solution beside the final number
                return {"problem": row["question"], "answer": str(gold_answer(row["answer"])), "solution": row["answer"]}
        else:
            from grl.envs.math import math_record

            def convert(row, where):  # `problem` and `answer` first, then every field the set has
                problem = math_record(row, where)
                return {"problem": problem.problem, "answer": problem.answer,
                        **{k: v for k, v in row.items() if k not in ("problem", "question", "answer")}}

        rows = load_dataset(hub_id, config, split=split)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest + ".part", "w", encoding="utf-8") as f:
            for i, row in enumerate(rows):
                f.write(json.dumps(convert(dict(row), f"{hub_id} row {i}"), ensure_ascii=False, default=str) + "\n")
        os.replace(dest + ".part", dest)
        print(f"{label}: {len(rows)} problems from {hub_id} -> {dest}", file=sys.stderr)
    except Exception as err:  # one line for the user, in the script's summary
        if os.path.exists(dest + ".part"):
            os.remove(dest + ".part")
        if os.path.isdir(os.path.dirname(dest)) and not os.listdir(os.path.dirname(dest)):
            os.rmdir(os.path.dirname(dest))
        reason = (str(err).strip().splitlines() or [""])[0] or type(err).__name__
        print(f"{label}\t{hub_id}\t{dest}\t{type(err).__name__}: {reason[:300]}", flush=True)
PY
  )
  return $got
}

install_gsm8k() {
  local dir="$DATA_DIR/gsm8k" split
  for split in train test; do
    if [[ -s "$dir/$split.jsonl" ]]; then echo "have $dir/$split.jsonl"; continue; fi
    hub_to_jsonl gsm8k main "$split" "GSM8K $split" "$GSM8K_DATASET" "$dir/$split.jsonl"
  done
}

install_math() {
  local name dest todo=()
  for name in "${MATH_SETS[@]}"; do
    dest="$DATA_DIR/math/$name/test.jsonl"
    if [[ -s "$dest" ]]; then echo "have $dest"; else todo+=("$name" "${MATH_DATASET[$name]}" "$dest"); fi
  done
  [[ ${#todo[@]} -eq 0 ]] || hub_to_jsonl math "" test "${todo[@]}"
}

WANT=() SMALL=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --webshop|--bird|--gsm8k|--math) WANT+=("${1#--}") ;;
    --all) WANT+=(webshop bird gsm8k math) ;;
    --small) SMALL=1 ;;
    --data-dir) [[ $# -ge 2 ]] || { echo "--data-dir needs a folder" >&2; exit 2; }; DATA_DIR="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if [[ ${#WANT[@]} -eq 0 ]]; then
  echo "nothing to install: name --webshop, --bird, --gsm8k, --math or --all" >&2; usage >&2; exit 2
fi

[[ -d "$DATA_DIR" ]] && DATA_DIR_EXISTED=1 || DATA_DIR_EXISTED=0
mkdir -p "$DATA_DIR" || { echo "cannot create $DATA_DIR" >&2; exit 1; }
echo "data folder: $DATA_DIR"
for what in $(printf '%s\n' "${WANT[@]}" | sort -u); do
  "install_$what"
done

# what a failed install created and left empty goes (never a folder the user had)
for what in webshop bird gsm8k math; do rmdir "$DATA_DIR/$what" 2>/dev/null; done
[[ "$DATA_DIR_EXISTED" == 1 ]] || rmdir "$DATA_DIR" 2>/dev/null

if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo >&2
  echo "Could not fetch ${#FAILED[@]} item(s):" >&2
  printf '  - %s\n' "${FAILED[@]}" >&2
  exit 1
fi
echo "done: everything asked for is in $DATA_DIR"
