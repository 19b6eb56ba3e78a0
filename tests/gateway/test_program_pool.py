"""Agent programs in worker processes (grl/gateway/program_pool.py): a program that exits, segfaults,
outgrows its memory, hangs or leaves a process running ends only its episode, counted by kind, beside sound
programs that score as usual; its worker is replaced, the sound ones are kept, and nothing is left running
once the runner closes. Workers are forked from a template process that imported the program once.
Processes are looked for by pid (the workers' and what the programs noted), never by
a scan of the machine, which other test runs share."""

import subprocess
import sys
import time

import psutil
import pytest

from grl.engines import SamplingParams, make_engine
from grl.gateway import program_pool
from grl.gateway.contract import ProgramTask
from grl.gateway.program_pool import ProgramOutcome, ProgramPool
from grl.gateway.program_worker import ProgramCall, descendants, is_running
from grl.gateway.programs import ProgramRunner
from grl.models import load_tokenizer
from tests.gateway.test_programs import PROGRAMS, task


@pytest.fixture(scope="module")
def runner():
    engine = make_engine("hf", "tiny", dtype="float32", device="cpu")
    runner = ProgramRunner(
        engine, load_tokenizer("tiny"), context=4096, max_response_length=16, max_failed_agent_ratio=1.0
    )
    yield runner
    runner.close()
    engine.shutdown()


def noted_pids(folder, name: str) -> list[int]:
    return [int(path.name.rpartition("-")[2]) for path in folder.glob(f"{name}-*")]


def test_each_fault_ends_only_its_episode_and_leaves_no_process(runner, tmp_path):
    noted = {"pid_folder": str(tmp_path)}
    tasks = [
        task("sound", "one_call", groups=2),
        task("exits", "exits", env_config=noted),
        task("segfaults", "segfaults", env_config=noted),
        task("grows", "grows", env_config={**noted, "megabytes": 768}, program_max_rss_mb=384),
        task("hangs", "hangs_noted", env_config=noted, program_timeout=3),
        task("leaves", "leaves_a_process", env_config=noted),
        task("by_messages", "returns_a_function_of_the_messages"),
    ]
    episodes, metrics = runner.run(tasks, 0, 0, SamplingParams(temperature=1.0, seed=0))
    by_task = {e.task: e for e in episodes}
    assert [e.score for e in episodes if e.task == "sound"] == [1.0, 1.0]
    assert (
        by_task["by_messages"].error is None and by_task["by_messages"].score == 2.0
    )  # scored in the worker
    kinds = {name: (e.error_kind, e.error) for name, e in by_task.items() if e.error is not None}
    assert set(kinds) == {"exits", "segfaults", "grows", "hangs", "leaves"}, kinds
    assert kinds["exits"][0] == "crash" and "exit code 3" in kinds["exits"][1]
    assert kinds["segfaults"][0] == "crash" and "SIGSEGV" in kinds["segfaults"][1]
    assert kinds["grows"][0] == "memory" and "program_max_rss_mb 384" in kinds["grows"][1]
    assert kinds["hangs"][0] == "timeout" and "program_timeout" in kinds["hangs"][1]
    assert kinds["leaves"][0] == "leftover_process"
    assert all(
        by_task[name].score == -0.1 and len(by_task[name].turns) == 1 for name in kinds
    )  # the call it made
    faults = {"program_crashes": 2, "program_memory_kills": 1, "program_leftover_processes": 1}
    assert {name: metrics[f"gateway/{name}"] for name in faults} == faults
    assert (
        metrics["gateway/program_errors"],
        metrics["gateway/program_timeouts"],
        metrics["gateway/bad_rewards"],
    ) == (0, 1, 0)

    faulty = [pid for name in kinds for pid in noted_pids(tmp_path, name)]
    assert len(faulty) == 6  # a worker each, and the process left behind
    assert not any(map(is_running, faulty))
    workers = runner.worker_pids()
    assert workers and not set(workers) & set(faulty)
    # The sound workers are kept: the next rollout is played by them, and by fresh ones for the faulty tasks.
    again, _ = runner.run(
        [task("sound", "one_call", groups=2), task("exits", "exits", env_config=noted)],
        1,
        0,
        SamplingParams(),
    )
    assert [e.error_kind for e in again] == [None, None, "crash"]
    assert set(workers) & set(runner.worker_pids())
    everything = [pid for worker in runner.worker_pids() for pid in (worker, *descendants(worker))]
    runner.close()
    assert everything and not any(map(is_running, everything))


def test_an_async_program_is_given_an_async_client_and_scores(runner):
    episodes, metrics = runner.run(
        [task("async", "one_call_async", groups=2)], 0, 0, SamplingParams(temperature=1.0, seed=0)
    )
    assert [e.error for e in episodes] == [None, None], episodes[0].error
    assert all(e.score == 1.0 and e.metrics["answered_tokens"] >= 1 and len(e.turns) == 1 for e in episodes)
    assert metrics["gateway/calls"] == 2


def test_workers_started_ahead_play_the_rollout(runner):
    spec = task("ahead", "one_call", groups=3)
    before = set(runner.worker_pids())  # other tests' pools
    runner.start_workers([spec])
    ahead = set(runner.worker_pids()) - before
    episodes, _ = runner.run([spec], 0, 0, SamplingParams(temperature=1.0, seed=0))
    assert [e.score for e in episodes] == [1.0, 1.0, 1.0]
    assert len(ahead) == 3 and set(runner.worker_pids()) - before == ahead


def test_a_path_that_names_no_program_stops_the_rollout_in_one_line(runner):
    with pytest.raises(
        ValueError, match=r"^program 'tests.gateway.programs:missing': .* has no callable missing$"
    ):
        runner.run([task("missing", "missing", groups=2)], 0, 0, SamplingParams())
    episodes, _ = runner.run([task("sound", "one_call")], 0, 0, SamplingParams())
    assert episodes[0].score == 1.0


def play(pool: ProgramPool, program: str, configs: list[dict]) -> list[ProgramOutcome]:
    """Plays one episode a config on `pool`, its calls addressed to no server (the programs call none)."""
    tasks = [ProgramTask("t", i, i, 0, config) for i, config in enumerate(configs)]
    calls = [ProgramCall(program, "http://127.0.0.1:9/v1", episode, 30.0) for episode in tasks]
    for key, call in enumerate(calls):
        pool.submit(key, call, list)
    ended = {}
    deadline = time.monotonic() + 120  # a bound on a broken pool, not a measurement
    while pool.pending and time.monotonic() < deadline:
        ended.update(pool.collect())
        time.sleep(0.01)
    assert len(ended) == len(calls), f"{len(ended)} of {len(calls)} episodes ended"
    return [ended[key] for key in range(len(calls))]


def test_workers_are_forked_from_a_template_that_imported_the_program_once():
    program = f"{PROGRAMS}:tells_who_imported_it"
    pool = ProgramPool(4, 60.0, program=program)
    try:
        pool.start(4)
        workers = pool.pids()
        outcomes = play(pool, program, [{}] * 4)
        assert all(o.ok for o in outcomes), outcomes
        template = psutil.Process(workers[0]).ppid()
        assert {o.value[1]["pid"] for o in outcomes} == set(workers) and len(
            workers
        ) == 4  # each worker played once
        assert {o.value[1]["imported_by"] for o in outcomes} == {
            template
        }  # ... and none imported the program
        assert all(psutil.Process(worker).ppid() == template for worker in workers)
        # A worker that dies is replaced by a fresh fork of the same template.
        (crashed,) = play(pool, program, [{"exit": True}])
        assert crashed.kind == "crash" and "exit code 3" in crashed.error
        outcomes = play(pool, program, [{}] * 4)
        assert {o.value[1]["imported_by"] for o in outcomes} == {template}
        assert len(pool.pids()) == 4 and set(pool.pids()) != set(workers)
        everything = [template, *pool.pids(), *workers]
    finally:
        pool.close()
    assert not any(map(is_running, everything))


def test_a_program_whose_import_fails_crashes_or_hangs_fails_as_in_a_fresh_interpreter(tmp_path, monkeypatch):
    pool = ProgramPool(2, 60.0, program="no_such_module:f")
    with pytest.raises(
        ValueError, match=r"^program 'no_such_module:f': cannot import no_such_module: ModuleNotFoundError"
    ):
        play(pool, "no_such_module:f", [{}])
    pool.close()
    # One that ends its process at import ends its template: workers then import it themselves, and crash.
    (tmp_path / "exits_at_import.py").write_text("import os\n\nos._exit(5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pool = ProgramPool(2, 60.0, program="exits_at_import:f")
    try:
        outcomes = play(pool, "exits_at_import:f", [{}, {}])
    finally:
        pool.close()
    assert [(o.kind, "exit code 5" in o.error) for o in outcomes] == [("crash", True)] * 2
    # One whose import hangs is given up on after START_GRACE_S, in its template and then in its worker.
    (tmp_path / "hangs_at_import.py").write_text("import time\n\ntime.sleep(3600)\n")
    monkeypatch.setattr(program_pool, "START_GRACE_S", 1.0)
    pool = ProgramPool(1, 1.0, program="hangs_at_import:f")
    try:
        (outcome,) = play(pool, "hangs_at_import:f", [{}])
    finally:
        pool.close()
    assert outcome.kind == "timeout"


def test_a_template_without_the_program_is_waited_for_past_the_grace(monkeypatch):
    # With no grace at all, the template that imports the program is given up on at once; the one that then
    # imports only `openai` must still be waited for (restarting it would start the same imports forever).
    monkeypatch.setattr(program_pool, "START_GRACE_S", 0.0)
    program = f"{PROGRAMS}:tells_who_imported_it"
    pool = ProgramPool(1, 60.0, program=program)
    try:
        (outcome,) = play(pool, program, [{}])
    finally:
        pool.close()
    assert outcome.ok and outcome.value[0] == 1.0, outcome
    assert outcome.value[1]["imported_by"] == outcome.value[1]["pid"]  # the worker imported it itself


def test_the_template_and_its_workers_end_with_the_pools_process():
    script = (
        "from grl.gateway.program_pool import ProgramPool\n"
        f"pool = ProgramPool(2, 60.0, program={PROGRAMS + ':one_call'!r})\n"
        "pool.start(2)\n"
        "print(*pool.pids(), flush=True)\n"
        "input()\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    workers = [int(pid) for pid in owner.stdout.readline().split()]
    template = psutil.Process(workers[0]).ppid()
    assert len(workers) == 2 and psutil.Process(template).ppid() == owner.pid
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 30  # they look for their parent once a second
    while any(map(is_running, [template, *workers])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(is_running, [template, *workers]))
