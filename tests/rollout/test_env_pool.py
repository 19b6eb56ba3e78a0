"""Env calls under a time limit on daemon threads."""

import threading

from grl.rollout.env_pool import run_calls


def test_results_in_order_and_errors_with_traceback():
    def boom():
        raise RuntimeError("env broke")

    results = run_calls([lambda: 1, boom, lambda: 3], workers=2, timeout=5)
    assert [r.value for r in results] == [1, None, 3]
    assert results[1].error.startswith("Traceback") and "RuntimeError: env broke" in results[1].error
    assert not results[1].timed_out


def test_hung_call_is_abandoned_and_does_not_starve_the_others():
    release = threading.Event()
    threads_before = threading.active_count()
    # One worker: if the hung call kept it, the other calls would never run.
    results = run_calls([lambda: release.wait(30), lambda: "b", lambda: "c"], workers=1, timeout=0.3)
    assert results[0].timed_out and "timed out" in results[0].error
    assert [r.value for r in results[1:]] == ["b", "c"]
    hung = [t for t in threading.enumerate() if t.name == "grl-env"]
    assert hung and all(t.daemon for t in hung)
    release.set()
    for t in hung:
        t.join(5)
    assert threading.active_count() <= threads_before + 1


def test_no_limit_and_no_calls():
    assert run_calls([], workers=4, timeout=1) == []
    assert run_calls([lambda: 5], workers=4, timeout=None)[0].value == 5
