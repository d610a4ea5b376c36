"""Tests for minidl_course/png_pipeline.py: one transform four ways, and the datasets that load it.

Every variant must give *identical* float32 batches (np.array_equal, not allclose): they all compute in
float64 in the same order and round once. Then the datasets go through minidl's process and thread workers,
torch's DataLoader and a multiprocessing.Pool, and must give the serial loop's batches there too.
"""

from __future__ import annotations

import functools
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loadertools import items_in_a_fresh_interpreter

import minidl
from minidl_bench import batches
from minidl_bench.harness import missing
from minidl_course import png_pipeline as P
from minidl_course import toy
from minidl_course.toy import FailingDataset

ROOT = Path(__file__).resolve().parents[1]
needs_numba = pytest.mark.skipif(bool(missing("numba")), reason="needs Numba")
needs_torch = pytest.mark.skipif(bool(missing("torch")), reason="needs torch")


# The "batch" variant hands out its (images, labels) tuple as it is; collated ones are lists.
assert_same_batches = functools.partial(batches.assert_same_batches, exact_containers=False)


def batch_of(dataset, indices):
    return P.collate_fn_for(dataset)([dataset[i] for i in indices])


# --- the codec and the transform --------------------------------------------------------------------

@given(seed=st.integers(0, 2**32 - 1), side=st.integers(1, 12))
@settings(max_examples=30, deadline=None)
def test_decoding_inverts_the_encoding(seed, side):
    import zlib

    image = P.make_images(1, side, seed)[0]
    raw = np.frombuffer(zlib.decompress(P.encode(image)), dtype=np.uint8).reshape(image.shape)
    np.testing.assert_array_equal(np.add.accumulate(raw, axis=1, dtype=np.uint8), image)
    assert not np.array_equal(raw, image) or side == 1  # what is stored is the filtered bytes, not the pixels


def test_the_numpy_transform_is_crop_flip_gain_normalise_of_the_decoded_image():
    dataset = P.EncodedImages(4, side=6, pad=3, seed=1)
    image = P.make_images(4, 9, seed=1)[2]
    y0, x0, flip, gain = dataset.params(2)
    crop = image[y0:y0 + 6, x0:x0 + 6].astype(np.float64)
    if flip:
        crop = crop[:, ::-1]
    expected = ((np.minimum(crop * gain, 255) / 255 - P._MEAN) / P._STD).transpose(2, 0, 1)
    np.testing.assert_allclose(P.decode_augment_numpy(dataset.raw(2), y0, x0, flip, gain, 6), expected, rtol=1e-6)


def test_augmentation_is_drawn_per_index_and_varies():
    dataset = P.EncodedImages(64, side=8, pad=4, seed=0)
    params = [dataset.params(i) for i in range(64)]
    assert params == [P.EncodedImages(64, side=8, pad=4, seed=0).params(i) for i in range(64)]  # same seed
    assert {p[2] for p in params} == {True, False} and len({p[:2] for p in params}) > 5
    assert all(0 <= y <= 4 and 0 <= x <= 4 and 0.8 <= g <= 1.2 for y, x, _, g in params)


@given(n=st.integers(1, 6), side=st.integers(1, 10), pad=st.integers(0, 5), seed=st.integers(0, 1000))
@settings(max_examples=25, deadline=None)
def test_loop_numpy_and_batch_variants_give_identical_batches(n, side, pad, seed):
    indices = list(range(n))
    reference = P.collate_fn_for(P.LoopPipeline(n, side, pad, seed))([P.LoopPipeline(n, side, pad, seed)[i]
                                                                      for i in indices])
    assert reference[0].shape == (n, 3, side, side) and reference[0].dtype == np.float32
    for variant in ("numpy", "batch"):
        dataset = P.make_dataset(variant, n, side=side, pad=pad, seed=seed)
        assert_same_batches([batch_of(dataset, indices)], [reference])


@needs_numba
@given(n=st.integers(1, 5), side=st.integers(1, 10), pad=st.integers(0, 5), seed=st.integers(0, 1000))
@settings(max_examples=15, deadline=None)
def test_numba_kernels_give_the_loops_batches(n, side, pad, seed):
    indices = list(range(n))
    reference = batch_of(P.LoopPipeline(n, side, pad, seed), indices)
    for kernel in ("cache", "nogil"):
        assert_same_batches([batch_of(P.NumbaPipeline(n, side, pad, seed, kernel=kernel), indices)], [reference])


@needs_numba
def test_the_uncached_kernel_compiles_in_each_dataset_and_agrees():
    dataset = P.NumbaPipeline(3, side=5, kernel="compile")
    assert dataset._compiled is None
    assert_same_batches([batch_of(dataset, [0, 1, 2])], [batch_of(P.LoopPipeline(3, side=5), [0, 1, 2])])
    assert dataset.compiled().signatures  # compiled here, on first use
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy._compiled is None and copy.kernel == "compile"  # compiled code does not travel with the dataset


@needs_numba
def test_kernel_options_nogil_and_cache_and_one_cache_entry_each():
    nogil, gil, plain = P.build_kernel("nogil"), P.build_kernel("cache"), P.build_kernel("compile")
    assert nogil.targetoptions.get("nogil") is True and not gil.targetoptions.get("nogil")
    assert nogil.py_func is not gil.py_func  # see NOTE [one entry point per Numba build]
    assert gil._cache.__class__.__name__ == "FunctionCache" and nogil._cache.__class__.__name__ == "FunctionCache"
    assert plain._cache.__class__.__name__ == "NullCache"


def test_bad_kernel_names_the_argument():
    with pytest.raises(ValueError, match="kernel="):
        P.NumbaPipeline(2, kernel="fast")
    if not missing("numba"):
        with pytest.raises(ValueError, match="kind="):
            P.build_kernel("fast")


# --- through loaders ---------------------------------------------------------------------------------

VARIANTS = ["loop", "numpy", "batch"] + (["numba"] if not missing("numba") else [])


@pytest.fixture(scope="module")
def order():
    return np.random.default_rng(3).permutation(40).tolist()


@pytest.fixture(scope="module")
def expected(order):
    dataset = P.LoopPipeline(40, side=6)
    return list(P.serial_loader(dataset, P.batches_of(order, 8)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
def test_minidl_workers_give_the_serial_loops_batches(variant, worker_method, order, expected):
    dataset = P.make_dataset(variant, 40, side=6)
    loader = minidl.DataLoader(dataset, batch_size=8, sampler=order, num_workers=2, worker_method=worker_method,
                               collate_fn=P.collate_fn_for(dataset))
    assert_same_batches(loader, expected)


@needs_torch
@pytest.mark.timeout(60)
@pytest.mark.parametrize("variant", VARIANTS)
def test_torch_workers_give_the_same_batches(variant, order, expected):
    import torch
    import torch.utils.data

    dataset = P.make_dataset(variant, 40, side=6)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=order, num_workers=2,
                                         collate_fn=P.collate_fn_for(dataset))
    assert_same_batches(loader, expected)
    if variant != "batch":  # with torch's own collate: tensors holding the same values
        tensors = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=order, num_workers=2)
        for (images, labels), (want, want_labels) in zip(tensors, expected):
            assert images.dtype == torch.float32 and np.array_equal(images.numpy(), want)
            assert np.array_equal(labels.numpy(), want_labels)


@needs_numba
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_numba_dataset_loads_in_spawned_workers(order, expected):
    dataset = P.NumbaPipeline(40, side=6, kernel="cache")
    dataset.warm_up()  # the parent's compiled code can't reach a spawned worker: it builds its own
    loader = minidl.DataLoader(dataset, batch_size=8, sampler=order, num_workers=2, multiprocessing_context="spawn",
                               collate_fn=P.collate_fn_for(dataset))
    assert_same_batches(loader, expected)


def test_datasets_load_by_reference_in_a_fresh_interpreter():
    datasets = {v: P.make_dataset(v, 5, side=4) for v in ("loop", "numpy", "batch")}
    for name, sample in items_in_a_fresh_interpreter(datasets, 3).items():
        for got, want in zip(sample, datasets[name][3]):
            assert np.array_equal(got, want)


# --- a Pool as a loader ------------------------------------------------------------------------------

def test_batches_of_cuts_the_order_like_batch_sampler():
    order = list(range(10))
    assert P.batches_of(order, 4) == list(minidl.BatchSampler(order, 4, drop_last=False))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("variant", ["loop", "batch"])
def test_pool_loader_gives_the_same_batches_in_order(variant, order, expected):
    dataset = P.make_dataset(variant, 40, side=6)
    assert_same_batches(P.pool_loader(dataset, P.batches_of(order, 8), 2), expected)


@pytest.mark.timeout(60)
def test_pool_loader_closed_early_leaves_no_worker():
    import multiprocessing

    before = set(multiprocessing.active_children())
    batches = P.pool_loader(P.NumpyPipeline(64, side=4), P.batches_of(range(64), 4), 2)
    next(batches)
    assert len(set(multiprocessing.active_children()) - before) == 2
    batches.close()  # leaves the `with Pool` block: terminate() and join
    assert set(multiprocessing.active_children()) - before == set()


@pytest.mark.timeout(60)
def test_pool_loader_reraises_the_workers_exception_with_its_traceback_as_cause():
    # A Pool re-raises the worker's exception with the worker's traceback attached as __cause__;
    # minidl (like torch) also names the worker that raised it.
    from multiprocessing.pool import RemoteTraceback

    with pytest.raises(KeyError, match="bad sample 5") as caught:
        list(P.pool_loader(FailingDataset(8, bad_index=5), P.batches_of(range(8), 2), 2, collate_fn=list))
    assert isinstance(caught.value.__cause__, RemoteTraceback)
    assert "in __getitem__" in str(caught.value.__cause__) and "bad sample 5" in str(caught.value.__cause__)
    loader = minidl.DataLoader(FailingDataset(8, bad_index=5), batch_size=2, num_workers=2, collate_fn=list)
    with pytest.raises(KeyError, match="Caught KeyError in DataLoader worker process"):
        list(loader)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("variant", ["numpy", "batch"])
def test_init_worker_and_fetch_make_a_naive_pool_loader(variant, order, expected):
    # The five-line loader of notebook 11: the dataset reaches each worker once, each task is a batch.
    import multiprocessing

    dataset = P.make_dataset(variant, 40, side=6)
    with multiprocessing.Pool(2, initializer=P.init_worker, initargs=(dataset,)) as pool:
        got = list(pool.imap(P.fetch, P.batches_of(order, 8), chunksize=1))
        assert len(got) == len(expected)
        assert_same_batches(got, expected)
        assert_same_batches(pool.map(P.fetch, P.batches_of(order, 8), chunksize=2), expected)
        pool.close()
        pool.join()


def test_fetch_uses_the_dataset_the_initializer_left():
    before = P._pool_dataset
    try:
        P.init_worker(P.make_dataset("loop", 8, side=4))
        images, labels = P.fetch([3, 1])
        reference = P.serial_loader(P.make_dataset("numpy", 8, side=4), [[3, 1]])
        assert_same_batches([(images, labels)], list(reference))
        assert P.fetch([0], collate_fn=list)[0][1] == 0  # a collate_fn of one's own, as pool_loader passes
    finally:
        P._pool_dataset = before


@pytest.mark.timeout(60)
def test_pool_loader_ends_its_pool_after_a_whole_epoch():
    import multiprocessing

    before = set(multiprocessing.active_children())
    batches = list(P.pool_loader(P.NumpyPipeline(32, side=4), P.batches_of(range(32), 4), 2))
    assert len(batches) == 8
    assert set(multiprocessing.active_children()) - before == set()  # closed and joined, nothing left


@pytest.mark.timeout(60)
def test_pool_loader_left_by_break_with_a_long_epoch_ahead_leaves_no_worker():
    # Leaving early used to be able to hang Pool.terminate() while imap's feeder pushed a long backlog.
    import gc
    import multiprocessing

    before = set(multiprocessing.active_children())
    for _ in range(3):
        for i, _batch in enumerate(P.pool_loader(P.NumpyPipeline(4000, side=4), P.batches_of(range(4000), 2), 2)):
            if i == 2:
                break
        gc.collect()  # the abandoned generator is closed: its `with Pool` block terminates the workers
        assert set(multiprocessing.active_children()) - before == set()


class BigSamples:
    """Samples of 2 MB, larger than a pipe's buffer: a worker spends a while in the middle of sending each batch."""

    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(2_000_000, index % 256, dtype=np.uint8)


@pytest.mark.timeout(60)
def test_pool_loader_left_early_while_workers_send_big_batches_ends_every_time():
    # terminate() here killed a worker halfway through sending, holding the result pipe's lock; the Pool's
    # task handler then waited on that lock forever, and terminate() on it (6th early exit of 10 in one run).
    import multiprocessing

    before = set(multiprocessing.active_children())
    for _ in range(30):
        batches = P.pool_loader(BigSamples(), P.batches_of(range(400), 1), 2, collate_fn=list)
        assert [int(next(batches)[0][0]) for _ in range(2)] == [0, 1]
        batches.close()
        assert set(multiprocessing.active_children()) - before == set()


@pytest.mark.timeout(60)
def test_pool_workers_start_with_the_parents_random_state_under_fork():
    import multiprocessing

    state = np.random.get_state()
    try:
        np.random.seed(0)  # as a notebook does: now the global generator's state is this process's to copy
        draws = P.pool_first_draws(2)
    finally:
        np.random.set_state(state)
    assert len(draws) == 2 and all(0 <= d < 1 for d in draws)
    if multiprocessing.get_start_method() == "fork":
        assert draws[0] == draws[1] == np.random.RandomState(0).random()  # both copied the seeded state
    loader = minidl.DataLoader(toy.GlobalRandomDataset(2), batch_size=1, num_workers=2, collate_fn=list)
    assert len({draws["numpy"] for batch in loader for _, draws in batch}) == 2  # each worker seeded apart


class ExitsAt(toy.RangeDataset):
    """Ends the process that fetches ``bad_index``, as a crash in a decoder would."""

    def __init__(self, n: int, bad_index: int) -> None:
        super().__init__(n)
        self.bad_index = bad_index

    def __getitem__(self, index: int) -> int:
        if index == self.bad_index:
            os._exit(3)
        return index


@pytest.mark.timeout(60)
def test_pool_loader_times_out_when_a_worker_dies_where_the_dataloader_raises():
    import multiprocessing

    with pytest.raises(multiprocessing.TimeoutError):  # the Pool starts a new worker, but the batch is lost
        list(P.pool_loader(ExitsAt(4, 1), P.batches_of(range(4), 1), 2, collate_fn=list, timeout=3))
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3\."):
        list(minidl.DataLoader(ExitsAt(4, 1), num_workers=2, collate_fn=list))
