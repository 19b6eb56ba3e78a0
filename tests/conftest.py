import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Tests run offline and quietly: no W&B upload, no tokenizer threads fighting pytest.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The suite computes in fp32 on every machine CI may land on, AMX or AVX2 alike: `dtype: auto` is bf16 only
# where oneDNN may use bf16 instructions (grl.models.cpu_compute), and this cap, which Ray workers and engine
# processes inherit, rules them out. The exactness tests (packed against padded rows, a resumed run against
# an uninterrupted one) are written for fp32; the tests of the rule itself patch what torch reports.
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")

SHARED_DATA = ROOT.parent / "shared" / "data"
