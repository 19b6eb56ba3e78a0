"""A CPU rank's matmul peak (grl/workers/peak.py), the denominator of `perf/mfu/actor` on CPU."""

import json

import torch
from torch.utils.flop_counter import FlopCounterMode

from grl.workers import peak


def test_the_peak_pass_counts_the_flops_torch_counts():
    once, flops = peak.linear_pass(64, 160, torch.float32)
    with FlopCounterMode(display=False) as counter:
        once()
    assert counter.get_total_flops() == flops


def test_the_peak_is_measured_once_per_cpu_kind_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = peak.cached_peak(64, 160, torch.float32)
    known = json.loads(peak.cache_path().read_text())
    (key,) = known
    assert measured > 0 and known[key] == measured
    assert peak.cpu_kind() in key and f"{torch.get_num_threads()} threads" in key and "torch.float32" in key
    peak.cache_path().write_text(json.dumps({key: 123.0}))
    assert peak.cached_peak(64, 160, torch.float32) == 123.0  # read, not measured again
    assert peak.cached_peak(64, 160, torch.bfloat16) != 123.0  # another dtype is another entry
    peak.cache_path().write_text("not json")
    assert peak.cached_peak(64, 160, torch.float32) > 0 and key in json.loads(peak.cache_path().read_text())
