"""The exercise checkers, ch04 (finding the slow sample in a trace): each passes a learner's copy of the reference
answer and rejects typical wrong answers with the hint that names the mistake.
"""

import re

import pytest
from exercise_support import (
    learner_copy,
    rejects,
)

from minidl.dataloader import DataLoader
from minidl_course.exercises import (
    check_slow_sample,
    slow_loader,
)
from minidl_course.sharing_demo import use_file_system_strategy
from minidl_course.toy import RangeDataset

find_slow_sample = learner_copy("ch04_slow_sample").find_slow_sample


# --- check_slow_sample (ch04) ----------------------------------------------------------------------


def _duration(row):
    return row["end"] - row["start"]


@pytest.mark.measures
def test_check_slow_sample_accepts_the_reference_and_says_what_it_measured(capsys):
    check_slow_sample(find_slow_sample)
    out = capsys.readouterr().out
    assert re.search(r"sample 17, \d+ ms \(median \d+\.\d ms\)", out), out
    assert out.endswith("All 4 checks passed\n")


def test_the_reference_finds_the_slow_sample_of_a_shuffled_loader_with_workers():
    assert find_slow_sample(slow_loader(n=24, slow_index=11, num_workers=2, shuffle=True, seed=3)) == 11


def reads_the_dataset(loader):
    return loader.dataset.slow_index


def slowest_batch(loader):
    for _ in loader:
        pass
    return max((r for r in loader.trace.rows() if r["event"] == "fetch"), key=_duration)["batch"]


def first_of_the_slowest_fetch(loader):
    for _ in loader:
        pass
    rows = loader.trace.rows()
    batch = max((r for r in rows if r["event"] == "fetch"), key=_duration)["batch"]
    return next(r["index"] for r in rows if r["event"] == "getitem" and r["batch"] == batch)


def started_last(loader):
    for _ in loader:
        pass
    return max((r for r in loader.trace.rows() if r["event"] == "getitem"), key=lambda r: r["start"])["index"]


def assumes_sequential(loader):
    for _ in loader:
        pass
    rows = [r for r in loader.trace.rows() if r["event"] == "getitem"]
    slow = max(rows, key=_duration)
    return slow["batch"] * loader.batch_size + [r for r in rows if r["batch"] == slow["batch"]].index(slow)


def diagnoses_before_iterating(loader):
    loader.trace.diagnose()
    return 0


def returns_the_row(loader):
    for _ in loader:
        pass
    return max((r for r in loader.trace.rows() if r["event"] == "getitem"), key=_duration)


def off_by_one(loader):
    for _ in loader:
        pass
    return int(max((r for r in loader.trace.rows() if r["event"] == "getitem"), key=_duration)["index"]) + 1


def the_fastest(loader):
    for _ in loader:
        pass
    return int(min((r for r in loader.trace.rows() if r["event"] == "getitem"), key=_duration)["index"])


def reads_the_trace_before_iterating(loader):  # max() of no rows: a ValueError from the learner's own code
    return int(max((r for r in loader.trace.rows() if r["event"] == "getitem"), key=_duration)["index"])


@pytest.mark.parametrize("wrong, message", [
    (off_by_one, r"said sample 18.*off by one"),
    (the_fastest, r"that is the fastest sample"),
    (reads_the_trace_before_iterating, r"trace still empty.*iterate over the loader"),
    (reads_the_dataset, r"read the dataset's 'slow_index'.*find it there, by measuring"),
    (slowest_batch, r"said sample 4, but I timed each of the 24 samples myself: sample 17 took \d+ ms.*number of "
                    r"the batch"),
    (first_of_the_slowest_fetch, r"said sample 16, but I timed.*sample 17.*opens the batch that held the slow "
                                 r"sample: a fetch \(or wait\) row times the whole batch"),
    (started_last, r"said sample 23.*started last, it wasn't the slowest"),
    (assumes_sequential, r"shuffle=True.*this loader shuffles: a sample's place in the epoch is not its index"),
    (diagnoses_before_iterating, r"the trace is empty.*iterate over the loader"),
    (returns_the_row, r"returned a dict.*as a plain int"),
])
def test_check_slow_sample_rejects_a_wrong_finder_and_says_why(wrong, message):
    rejects(check_slow_sample, wrong, message)


@pytest.mark.parametrize("peek", [
    lambda dataset: dataset.__dict__["slow_index"],
    lambda dataset: vars(dataset)["slow_index"],
    lambda dataset: dataset.slow_delay,
], ids=["__dict__", "vars", "getattr"])
def test_reading_the_secret_through_the_instance_dict_is_a_peek(peek):
    def finds_it_by_peeking(loader):
        for _ in loader:
            pass
        index = peek(loader.dataset)
        return index if isinstance(index, int) else 0

    rejects(check_slow_sample, finds_it_by_peeking, r"your function read the dataset's '(__dict__|slow_delay)'")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_sending_the_dataset_to_workers_is_not_a_peek(method):
    loader = slow_loader(n=12, slow_index=7, num_workers=2)
    loader.multiprocessing_context = method
    assert find_slow_sample(loader) == 7
    assert loader.dataset.peeks == []


@pytest.fixture
def file_system_strategy():
    """torch's file_system sharing strategy in this process, as on a Mac (its only one), for one test."""
    import torch.multiprocessing

    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    yield
    torch.multiprocessing.set_sharing_strategy(before)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
@pytest.mark.usefixtures("file_system_strategy")
def test_the_checker_and_the_reference_agree_under_the_file_system_strategy(method, capsys):
    # As a Mac runs the exercise: file_system in the main process and in every worker. A worker's first shared
    # batch starts torch_shm_manager; that wait must not land in the next sample's traced span.
    def as_on_a_mac(loader):
        if loader.num_workers > 0:
            loader.multiprocessing_context = method
            loader.worker_init_fn = use_file_system_strategy
        return find_slow_sample(loader)

    check_slow_sample(as_on_a_mac)
    assert capsys.readouterr().out.endswith("All 4 checks passed\n")


class SeesTheShmManager(RangeDataset):
    """Each item says whether this process had started torch's shared-memory manager when the item was fetched."""

    def __getitem__(self, index: int) -> tuple[int, bool]:
        import psutil

        return index, any(child.name() == "torch_shm_manager" for child in psutil.Process().children())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.usefixtures("file_system_strategy")
def test_under_file_system_a_worker_starts_torchs_shm_manager_before_its_first_task(method):
    # With file_system, the first tensor a process shares starts torch_shm_manager and waits for it (a second or
    # more on a busy machine). A traced worker pays that before its first task, as part of its start; else the
    # first batch's collate (a worker collates into shared memory) or pickling would hold it.
    loader = DataLoader(SeesTheShmManager(8), batch_size=2, num_workers=2, trace=True,
                        multiprocessing_context=method, worker_init_fn=use_file_system_strategy)
    seen = [bool(started) for _, flags in loader for started in flags]
    assert seen == [True] * 8


# --- the slow sample read from the loader's trace, not timed outside the loader ---------------------------


def times_the_dataset_itself(loader):
    import time

    dataset = loader.dataset
    took = []
    for i in range(len(dataset)):
        start = time.perf_counter()
        dataset[i]
        took.append(time.perf_counter() - start)
    return max(range(len(took)), key=took.__getitem__)


def times_a_copy_of_the_dataset(loader):
    import copy

    return times_the_dataset_itself(type("L", (), {"dataset": copy.deepcopy(loader.dataset)})())


@pytest.mark.parametrize("wrong", [times_the_dataset_itself, times_a_copy_of_the_dataset])
def test_check_slow_sample_refuses_timing_the_samples_outside_the_loader(wrong):
    rejects(check_slow_sample, wrong, r"fetched 24 samples itself \(dataset\[i\]\), outside the loader.*"
                                      r"the loader's trace has already timed every getitem")


def test_a_last_started_sample_that_is_also_the_fastest_gets_both_hints():
    # On a busy machine the sample that started last can also be the quickest: the hint names both mistakes.
    from types import SimpleNamespace

    from minidl_course.exercises import ch04_slow_sample as ch04

    rows = [{"event": "getitem", "index": i, "batch": i // 4, "start": float(i), "end": i + (0.5 if i < 7 else 0.1)}
            for i in range(8)]
    rows[2]["end"] = 2.9  # sample 2 is the slow one
    loader = SimpleNamespace(trace=SimpleNamespace(rows=lambda: rows))
    hint = ch04._wrong_answer_hint(loader, 7, slowest=2, batch_size=4, shuffle=False)
    assert "that is the fastest sample" in hint and "started last" in hint
