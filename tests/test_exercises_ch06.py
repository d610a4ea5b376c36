"""The exercise checkers, ch06 (sharding a stream, and seeding workers): each passes a learner's copy of the
reference answer and rejects typical wrong answers with the hint that names the mistake.
"""

import os
import re
import subprocess
import sys
import textwrap

import ch06_seeding_recipes as recipes
import numpy as np
import pytest
import torch
from exercise_support import (
    learner_copy,
    rejects,
)

import minidl
from minidl_course import toy
from minidl_course.exercises import (
    AugmentedDataset,
    YourTurn,
    call_as_worker,
    check_worker_init_fn,
    check_worker_seeding,
    range_stream,
)

shard_worker_init_fn = learner_copy("ch06_sharding").shard_worker_init_fn
seed_worker = learner_copy("ch06_seeding").seed_worker


# --- check_worker_init_fn (ch06, sharding) -------------------------------------------------------------


def test_check_worker_init_fn_accepts_the_reference(capsys):
    check_worker_init_fn(shard_worker_init_fn)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def test_without_a_worker_init_fn_every_worker_replays_the_stream():
    got = sorted(int(x) for x in torch.utils.data.DataLoader(range_stream(0, 5), num_workers=2, batch_size=None))
    assert got == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def swaps_in_sharded_range(worker_id):
    torch.utils.data.get_worker_info().dataset.__class__ = toy.ShardedRange


def does_nothing(worker_id):
    pass


def floor_division(worker_id):
    info = torch.utils.data.get_worker_info()
    ds = info.dataset
    per = (ds.end - ds.start) // info.num_workers
    ds.start, ds.end = ds.start + worker_id * per, ds.start + (worker_id + 1) * per


def sets_only_start(worker_id):
    info = torch.utils.data.get_worker_info()
    ds = info.dataset
    ds.start = min(ds.start + worker_id * -(-(ds.end - ds.start) // info.num_workers), ds.end)


def minidls_worker_info(worker_id):
    info = minidl.get_worker_info()
    ds = info.dataset
    per = -(-(ds.end - ds.start) // info.num_workers)
    ds.start, ds.end = min(ds.start + worker_id * per, ds.end), min(ds.start + (worker_id + 1) * per, ds.end)


NOTEBOOK_STREAM = range_stream(0, 10)


def changes_the_notebooks_dataset(worker_id):
    info = torch.utils.data.get_worker_info()
    NOTEBOOK_STREAM.start = worker_id * 10 // info.num_workers


@pytest.mark.parametrize("wrong, message", [
    (swaps_in_sharded_range, r"turned the dataset into minidl's toy.ShardedRange.*swapped in minidl's own"),
    (does_nothing, r"RangeStream\(0, 10\) with num_workers=2.*never read get_worker_info\(\).dataset"),
    (floor_division, r"RangeStream\(0, 10\) with num_workers=3.*sample 9 is in none of them.*round the shard size up"),
    (sets_only_start, r"sample 5 is in worker 0 and worker 1.*set the end of each worker's part"),
    (minidls_worker_info, r"'NoneType' object has no attribute.*call torch.utils.data.get_worker_info\(\)"),
    (changes_the_notebooks_dataset, r"never read get_worker_info\(\).dataset.*changing a dataset from the notebook"),
])
def test_check_worker_init_fn_rejects_a_wrong_one_and_says_why(wrong, message):
    rejects(check_worker_init_fn, wrong, message)


def test_check_worker_init_fn_says_when_every_worker_keeps_the_whole_range():
    def reads_but_keeps(worker_id):
        _ = torch.utils.data.get_worker_info().dataset

    rejects(check_worker_init_fn, reads_but_keeps, r"every worker kept the whole range.*set info.dataset.start")


# --- check_worker_seeding (ch06, seeding) --------------------------------------------------------------


def test_check_worker_seeding_accepts_the_reference(capsys):
    check_worker_seeding(seed_worker)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


@pytest.mark.parametrize("loader_cls", [minidl.DataLoader, torch.utils.data.DataLoader])
def test_without_a_fix_workers_draw_the_same_numbers(loader_cls):
    draws = [float(x) for _, d in loader_cls(AugmentedDataset(8), batch_size=2, num_workers=2) for x in d]
    assert draws[:2] == draws[2:4]  # worker 0's first batch and worker 1's


def takes_info_rng(worker_id):
    info = torch.utils.data.get_worker_info()
    info.dataset.rng = info.rng


def reseeds_numpys_global(worker_id):
    np.random.seed(torch.utils.data.get_worker_info().seed % 2**32)


def seeds_from_worker_id(worker_id):
    torch.utils.data.get_worker_info().dataset.rng = np.random.default_rng(worker_id)


def seeds_from_the_os(worker_id):
    torch.utils.data.get_worker_info().dataset.rng = np.random.default_rng()


def seeds_from_the_pid(worker_id):  # workers differ, but no run repeats: the pids change
    torch.utils.data.get_worker_info().dataset.rng = np.random.default_rng(os.getpid())


def takes_info_rngs_numpy_generator(worker_id):  # minidl's thread workers' container; None in a process worker
    info = torch.utils.data.get_worker_info()
    info.dataset.rng = info.rng.numpy_generator


def minidls_info_for_seeding(worker_id):
    info = minidl.get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


@pytest.mark.parametrize("wrong, message", [
    (takes_info_rng, r"read get_worker_info\(\).rng.*the loader's own per-worker generator"),
    (toy.seed_numpy_from_worker, r"called toy.seed_numpy_from_worker.*reseeds NumPy's global stream"),
    (does_nothing, r"still draws .* as it did before your worker_init_fn.*reseed the worker's own copy"),
    (reseeds_numpys_global, r"still draws.*you reseeded NumPy's global stream.*dataset.rng"),
    (seeds_from_worker_id, r"worker 0 drew .* with info.seed=1234, and the same with info.seed=2234.*worker_id alone "
                           r"repeats every epoch"),
    (seeds_from_the_os, r"called twice with the same info.seed.*not from the clock or the OS"),
    (seeds_from_the_pid, r"do not follow info.seed.*the process id or the clock changes from run to run"),
    (takes_info_rngs_numpy_generator, r"read get_worker_info\(\).rng, then raised AttributeError.*None in a "
                                      r"process worker"),
    (minidls_info_for_seeding, r"'NoneType' object has no attribute.*call torch.utils.data.get_worker_info\(\)"),
])
def test_check_worker_seeding_rejects_a_wrong_fix_and_says_why(wrong, message):
    rejects(check_worker_seeding, wrong, message)


def test_call_as_worker_answers_get_worker_info_for_that_worker_and_restores_it():
    seen = []
    dataset = range_stream(0, 4)
    call_as_worker(lambda k: seen.append(torch.utils.data.get_worker_info()), dataset, worker_id=1, num_workers=3,
                   seed=9)
    info = seen[0]
    assert (info.id, info.num_workers, info.seed, info.dataset) == (1, 3, 9, dataset)
    assert torch.utils.data.get_worker_info() is None


def unwritten(worker_id):  # at module level, so a spawned worker can import it
    raise YourTurn()


def test_your_turn_raised_in_a_worker_still_shows_as_its_message():
    with pytest.raises(YourTurn) as info:
        list(minidl.DataLoader(AugmentedDataset(4), num_workers=1, worker_init_fn=unwritten))
    assert info.value._render_traceback_() == [f"YourTurn: {YourTurn.MESSAGE} (raised in a worker)"]


# --- the split the exercise's text prints, and a worker seeded as a real one ----------------------------


def other_even_split(worker_id):  # 3, 3, 4 for ten samples: each comes once, but not the split the text prints
    info = torch.utils.data.get_worker_info()
    ds = info.dataset
    n, k = ds.end - ds.start, info.num_workers
    start = ds.start
    ds.start, ds.end = start + worker_id * n // k, start + (worker_id + 1) * n // k


def test_check_worker_init_fn_holds_to_the_split_its_text_prints():
    rejects(check_worker_init_fn, other_even_split,
            r"num_workers=3.*worker 0's part should be \[0, 4\).*contiguous parts of ceil\(10 / 3\) = 4")


@pytest.mark.parametrize("right", [recipes.seeds_from_torch_initial_seed, recipes.seeds_from_the_reseeded_numpy,
                                   recipes.seeds_from_the_reseeded_random])
def test_check_worker_seeding_accepts_seeds_from_the_workers_own_seeded_streams(right, capsys):
    check_worker_seeding(right)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def test_call_as_worker_seeds_torch_numpy_and_random_as_a_worker_and_puts_them_back():
    import random

    before = (torch.initial_seed(), np.random.get_state()[1][:4].tolist(), random.getstate())
    seen = []

    def note(worker_id):
        seen.append((torch.initial_seed(), np.random.get_state()[1][:4].tolist(), random.random()))

    for k in range(2):
        call_as_worker(note, range_stream(0, 4), worker_id=k, num_workers=2, seed=100 + k)
    assert [s[0] for s in seen] == [100, 101]
    assert seen[0][1] != seen[1][1] and seen[0][2] != seen[1][2]
    assert (torch.initial_seed(), np.random.get_state()[1][:4].tolist(), random.getstate()) == before


# --- a function defined in a notebook cell: refused only where the learner's workers could not import it ---------

CELL_FUNCTIONS = {
    "check_worker_seeding": """
        def answer(worker_id):
            info = torch.utils.data.get_worker_info()
            info.dataset.rng = np.random.default_rng(info.seed)
    """,
    "check_worker_init_fn": """
        def answer(worker_id):
            info = torch.utils.data.get_worker_info()
            ds = info.dataset
            per = -(-(ds.end - ds.start) // info.num_workers)
            ds.start, ds.end = min(ds.start + worker_id * per, ds.end), min(ds.start + (worker_id + 1) * per, ds.end)
    """,
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("checker", sorted(CELL_FUNCTIONS))
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_function_defined_in_a_notebook_cell_is_refused_only_off_fork(checker, method):
    # python -c runs the code as __main__ without a __file__, as a notebook's kernel does
    script = textwrap.dedent(f"""
        import multiprocessing
        multiprocessing.set_start_method({method!r}, force=True)
        import numpy as np
        import torch.utils.data
        from minidl_course.exercises import {checker}
    """) + textwrap.dedent(CELL_FUNCTIONS[checker]) + textwrap.dedent(f"""
        try:
            {checker}(answer)
        except AssertionError as refused:
            print(refused)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    if method == "fork":
        assert re.fullmatch(r"All \d+ checks passed\n", done.stdout), done.stdout
    else:
        assert "'answer', defined in this notebook" in done.stdout, done.stdout
        assert "workers started with spawn can't import a function defined in a notebook cell" in done.stdout
