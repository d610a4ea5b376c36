"""minidl.course.exercises: each checker passes the reference answer, refuses one that only wraps the library's
own implementation, and explains what is wrong with typical mistakes. The answers come from minidl.course.solutions.
"""

import re
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
import torch

import minidl
from minidl.course import toy
from minidl.course.exercises import (
    RecordingLoader,
    check_collate,
    check_prefetcher,
    check_sampler,
    check_worker_loop,
    first_difference,
    make_image_batches,
    make_token_samples,
    run_worker_processes,
)
from minidl.course.solutions.ch02_sampler import SortedBatchSampler
from minidl.course.solutions.ch03_collate import pad_mask_collate
from minidl.course.solutions.ch05_worker_loop import worker_loop as simple_worker_loop
from minidl.course.solutions.ch08_prefetcher import prefetch as prefetch_one_ahead
from minidl.prefetch import PrefetchLoader
from minidl.sampler import BatchSampler, SequentialSampler
from minidl.worker import ExceptionWrapper


def rejects(check, answer, message, case=r"check \d+ failed, for "):
    """``check(answer)`` fails at a case, with a message matching ``message``; returns the message."""
    with pytest.raises(AssertionError, match=case) as info:
        check(answer)
    assert re.search(message, str(info.value), re.DOTALL), str(info.value)
    return str(info.value)


# --- what the learner can import -------------------------------------------------------------------


def test_no_reference_answer_is_importable_from_the_checkers():
    code = ("import sys, minidl.course.exercises as e\n"
            "from minidl.course.exercises import ch02_sampler, ch03_collate, ch04_slow_sample, ch05_reorder, "
            "ch05_worker_loop, ch06_seeding, ch06_sharding, ch08_prefetcher\n"
            "e.check_worker_init_fn.__module__, e.range_stream(0, 1)\n"
            "print(sorted(m for m in sys.modules if m.startswith('minidl.course.solutions')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    import minidl.course.exercises as exercises

    for name in ("SortedBatchSampler", "pad_mask_collate", "simple_worker_loop", "prefetch_one_ahead", "reorder"):
        assert not hasattr(exercises, name)


def test_importing_the_checkers_needs_no_torch():
    code = "import sys, minidl.course.exercises; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_your_turn_shows_as_one_line_in_a_notebook():
    from minidl.course.exercises import YourTurn

    assert YourTurn()._render_traceback_() == [f"YourTurn: {YourTurn.MESSAGE}"]

# --- the references agree with torch ---------------------------------------------------------------


def test_sorted_batch_sampler_without_shuffle_is_a_batch_sampler_over_the_sorted_order():
    lengths = [4, 2, 2, 9, 1, 2, 4]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    for drop_last in (False, True):
        expected = [[order[i] for i in b] for b in BatchSampler(SequentialSampler(order), 3, drop_last)]
        sampler = SortedBatchSampler(lengths, 3, drop_last=drop_last)
        assert list(sampler) == expected
        assert len(sampler) == len(expected)


def test_sorted_batch_sampler_shuffles_batches_like_torch_randperm():
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    batches = list(SortedBatchSampler(lengths, 2))
    g = torch.Generator().manual_seed(3)
    sampler = SortedBatchSampler(lengths, 2, shuffle=True, generator=torch.Generator().manual_seed(3))
    for _ in range(3):  # a new order each epoch, drawn from the same generator
        assert list(sampler) == [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]


def test_pad_mask_collate_matches_pad_sequence():
    batch = make_token_samples(6, seed=4, zero_tokens=True)
    out = pad_mask_collate(batch)
    seqs = [torch.as_tensor(s["tokens"]) for s in batch]
    assert torch.equal(out["tokens"], torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True))
    ones = [torch.ones(len(s), dtype=torch.bool) for s in seqs]
    assert torch.equal(out["mask"], torch.nn.utils.rnn.pad_sequence(ones, batch_first=True))
    assert torch.equal(out["label"], torch.tensor([s["label"] for s in batch]))


def test_make_token_samples_is_reproducible():
    a, b = make_token_samples(5, seed=2), make_token_samples(5, seed=2)
    assert first_difference(a, b) is None
    assert all(s["tokens"].dtype == np.int64 and 1 <= len(s["tokens"]) <= 12 for s in a)
    assert min(int(s["tokens"].min()) for s in a) >= 1


def test_first_difference_names_the_place():
    assert first_difference([1, {"a": 2}], [1, {"a": 2}]) is None
    assert first_difference([1, {"a": 2}], [1, {"a": 3}]) == "batch[1]['a'] should be 2, but it is 3"
    assert first_difference(torch.zeros(2), torch.zeros(3)) == "batch should have shape (2,), but it has shape (3,)"
    assert "dtype torch.float32" in first_difference(torch.zeros(2), torch.zeros(2, dtype=torch.int64))
    assert first_difference(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 2], [3, 5]])) == (
        "batch[1, 1] should be 4, but it is 5"
    )
    assert first_difference(np.zeros(2), torch.zeros(2)) == "batch should be a numpy.ndarray, but it is a torch.Tensor"
    assert first_difference({"a": 1}, {"b": 1}) == "batch should have the keys ['a'], but it has ['b']"


# --- check_sampler ---------------------------------------------------------------------------------


def test_check_sampler_accepts_the_reference(capsys):
    check_sampler(SortedBatchSampler)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


@pytest.mark.parametrize("check, answer", [(check_sampler, SortedBatchSampler), (check_collate, pad_mask_collate)])
def test_checks_leave_the_global_rng_alone(check, answer):
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    check(answer)
    assert torch.equal(torch.rand(3), expected)


class TiesReversed(SortedBatchSampler):
    """Breaks ties by the larger index first."""

    def _sorted_batches(self):
        order = sorted(range(len(self.lengths)), key=lambda i: (self.lengths[i], -i))
        return [order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size)][
            : len(self) if self.drop_last else None
        ]


class Longest(SortedBatchSampler):
    """Sorts longest first."""

    def _sorted_batches(self):
        order = sorted(range(len(self.lengths)), key=lambda i: -self.lengths[i])
        return [order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size)]


class KeepsLastBatch(SortedBatchSampler):
    """Ignores drop_last when iterating (but not in __len__)."""

    def _sorted_batches(self):
        order = sorted(range(len(self.lengths)), key=lambda i: self.lengths[i])
        return [order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size)]


class AlwaysRoundsUp(SortedBatchSampler):
    def __len__(self):
        return -(-len(self.lengths) // self.batch_size)


class ShufflesOnce(SortedBatchSampler):
    """Draws the permutation once, in __init__: every epoch repeats it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        batches = self._sorted_batches()
        self._order = [batches[i] for i in torch.randperm(len(batches), generator=self.generator).tolist()]

    def __iter__(self):
        if not self.shuffle:
            return super().__iter__()
        return iter(self._order)


class ShufflesIndices(SortedBatchSampler):
    """Shuffles the indices, then batches them: batches are no longer of similar length."""

    def __iter__(self):
        if not self.shuffle:
            yield from super().__iter__()
            return
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        for s in range(0, len(order) - (len(order) % self.batch_size if self.drop_last else 0), self.batch_size):
            yield order[s : s + self.batch_size]


class IgnoresGenerator(SortedBatchSampler):
    def __iter__(self):
        batches = self._sorted_batches()
        order = torch.randperm(len(batches)).tolist() if self.shuffle else range(len(batches))
        for i in order:
            yield batches[i]


class YieldsTuples(SortedBatchSampler):
    def __iter__(self):
        return (tuple(b) for b in super().__iter__())


class YieldsInts(SortedBatchSampler):
    """A plain sampler: indices, not batches of them."""

    def __iter__(self):
        return (i for b in super().__iter__() for i in b)


class YieldsNumpyInts(SortedBatchSampler):
    def __iter__(self):
        order = np.argsort(self.lengths, kind="stable")
        return iter([list(order[s : s + self.batch_size]) for s in range(0, len(order), self.batch_size)])


class NoLen:
    def __init__(self, lengths, batch_size, drop_last=False, shuffle=False, generator=None):
        self.inner = SortedBatchSampler(lengths, batch_size, drop_last, shuffle, generator)

    def __iter__(self):
        return iter(self.inner)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (TiesReversed, r"equal length keep their index order.*stable sort"),
        (Longest, r"sorted by length, shortest first"),
        (KeepsLastBatch, r"drop_last=True the last, short batch \(1 index\) must not be yielded"),
        (AlwaysRoundsUp, r"len\(sampler\) should be 2, but it is 3"),
        (ShufflesOnce, r"epoch 2 gave the same batch order as epoch 1.*inside __iter__"),
        (ShufflesIndices, r"shuffle reorders whole batches, never the indices inside them"),
        (IgnoresGenerator, r"generator=self.generator"),
        (YieldsTuples, r"batch 0 is a tuple: \(1, 2\)"),
        (YieldsInts, r"batch 0 is an int: 1"),
        (YieldsNumpyInts, r"holds np.int64\(1\), a numpy.int64.*plain Python ints"),
        (NoLen, r"len\(sampler\) failed.*define __len__"),
    ],
)
def test_check_sampler_rejects_a_wrong_sampler_and_says_why(wrong, message):
    with pytest.raises(AssertionError, match=r"check \d+ failed, for lengths=\[") as info:
        check_sampler(wrong)
    assert re.search(message, str(info.value), re.DOTALL), str(info.value)


def test_check_sampler_names_the_case_when_the_sampler_raises():
    class Unfinished(SortedBatchSampler):
        def __len__(self):
            raise NotImplementedError("write __len__")

    with pytest.raises(NotImplementedError, match="write __len__") as info:
        check_sampler(Unfinished)
    assert "lengths=[3, 1, 2]" in info.value.__notes__[0]


# --- check_collate ---------------------------------------------------------------------------------


def test_check_collate_accepts_the_reference(capsys):
    check_collate(pad_mask_collate)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def mask_from_tokens(batch):
    out = pad_mask_collate(batch)
    out["mask"] = out["tokens"] != 0
    return out


def float_tokens(batch):
    out = pad_mask_collate(batch)
    out["tokens"] = out["tokens"].float()
    return out


def left_padded(batch):
    longest = max(len(s["tokens"]) for s in batch)
    tokens = torch.zeros(len(batch), longest, dtype=torch.int64)
    mask = torch.zeros(len(batch), longest, dtype=torch.bool)
    for i, s in enumerate(batch):
        n = len(s["tokens"])
        tokens[i, longest - n :] = torch.as_tensor(s["tokens"])
        mask[i, longest - n :] = True
    return {"tokens": tokens, "mask": mask, "label": torch.tensor([s["label"] for s in batch])}


def fixed_length(batch):
    tokens = torch.zeros(len(batch), 12, dtype=torch.int64)
    mask = torch.zeros(len(batch), 12, dtype=torch.bool)
    for i, s in enumerate(batch):
        tokens[i, : len(s["tokens"])] = torch.as_tensor(s["tokens"])
        mask[i, : len(s["tokens"])] = True
    return {"tokens": tokens, "mask": mask, "label": torch.tensor([s["label"] for s in batch])}


def no_mask(batch):
    out = pad_mask_collate(batch)
    del out["mask"]
    return out


def labels_as_list(batch):
    out = pad_mask_collate(batch)
    out["label"] = [s["label"] for s in batch]
    return out


def pads_in_place(batch):
    longest = max(len(s["tokens"]) for s in batch)
    for s in batch:
        s["tokens"] = np.pad(s["tokens"], (0, longest - len(s["tokens"])))
    return pad_mask_collate(batch)


def returns_a_tuple(batch):
    out = pad_mask_collate(batch)
    return out["tokens"], out["mask"], out["label"]


@pytest.mark.parametrize(
    "wrong, message",
    [
        (mask_from_tokens, r"real token 0 at position \d+: build the mask from the lengths"),
        (float_tokens, r"batch\['tokens'\] should have dtype torch.int64, but it has dtype torch.float32"),
        (left_padded, r"padding goes on the right"),
        (fixed_length, r"should have shape \(2, 3\), but it has shape \(2, 12\).*not a fixed length"),
        (no_mask, r"should have the keys \['label', 'mask', 'tokens'\], but it has \['label', 'tokens'\]"),
        (labels_as_list, r"batch\['label'\] should be a torch.Tensor, but it is a list"),
        (pads_in_place, r"changed the samples it was given"),
        (returns_a_tuple, r"should be a dict .* but it is a tuple"),
    ],
)
def test_check_collate_rejects_a_wrong_collate_and_says_why(wrong, message):
    with pytest.raises(AssertionError, match=r"check \d+ failed, for ") as info:
        check_collate(wrong)
    assert re.search(message, str(info.value), re.DOTALL), str(info.value)


def test_check_collate_names_the_case_when_the_collate_raises():
    def unfinished(batch):
        raise NotImplementedError("write the collate")

    with pytest.raises(NotImplementedError, match="write the collate") as info:
        check_collate(unfinished)
    assert "two samples, 3 and 1 tokens" in info.value.__notes__[0]


# --- check_worker_loop (ch05) ----------------------------------------------------------------------
# The wrong loops live at module level, so worker processes (under any start method) could import them.


def test_check_worker_loop_accepts_the_reference(capsys):
    check_worker_loop(simple_worker_loop)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def test_check_worker_loop_accepts_the_reference_under_spawn(capsys):
    check_worker_loop(simple_worker_loop, start_method="spawn")
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def unpacks_the_sentinel(dataset, index_queue, result_queue, collate_fn):
    while True:
        task_idx, indices = index_queue.get()
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task_idx, batch))


def dies_on_a_bad_sample(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        result_queue.put((task_idx, collate_fn([dataset[i] for i in indices])))


def numbers_tasks_itself(dataset, index_queue, result_queue, collate_fn):
    count = 0
    while (task := index_queue.get()) is not None:
        try:
            batch = collate_fn([dataset[i] for i in task[1]])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((count, batch))
        count += 1


def forgets_to_collate(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        try:
            batch = [dataset[i] for i in indices]
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task_idx, batch))


def skips_the_sentinel(dataset, index_queue, result_queue, collate_fn):
    while True:
        task = index_queue.get()
        if task is None:
            continue  # should leave
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task_idx, batch))


def puts_the_exception(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception as e:
            batch = e
        result_queue.put((task_idx, batch))


def stops_at_the_first_error(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            result_queue.put((task_idx, ExceptionWrapper(where="in a worker")))
            return
        result_queue.put((task_idx, batch))


def answers_without_the_number(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        try:
            batch = collate_fn([dataset[i] for i in task[1]])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put(batch)


lambda_loop = lambda *args: simple_worker_loop(*args)  # noqa: E731 -- a lambda can't be pickled for spawn


@pytest.mark.parametrize(
    "wrong, message",
    [
        (unpacks_the_sentinel, r"answered every task, then raised TypeError.*check `if task is None` before"),
        (dies_on_a_bad_sample, r"died with KeyError.*on task 0 \(indices \[4, 5\]\).*survive a bad sample"),
        (numbers_tasks_itself, r"should be for task 7, but it says task 0.*not your own count"),
        (forgets_to_collate, r"should be a torch.Tensor, but it is a list.*pass it through collate_fn"),
        (skips_the_sentinel, r"read past the sentinel.*return from the function right away"),
        (puts_the_exception, r"should be an ExceptionWrapper holding the KeyError.*not the exception itself"),
        (stops_at_the_first_error, r"returned after 1 of 3 answers.*only the sentinel ends the loop"),
        (answers_without_the_number, r"answer 0 should be the pair \(0, '<batch>'\), but it is a torch.Tensor"),
    ],
)
def test_check_worker_loop_rejects_a_wrong_loop_and_says_why(wrong, message):
    with pytest.raises(AssertionError, match=r"check \d+ failed, for ") as info:
        check_worker_loop(wrong)
    assert re.search(message, str(info.value), re.DOTALL), str(info.value)


def test_check_worker_loop_needs_a_function_workers_can_import(monkeypatch):
    def in_a_cell(dataset, index_queue, result_queue, collate_fn):
        simple_worker_loop(dataset, index_queue, result_queue, collate_fn)

    in_a_cell.__module__ = "__main__"
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # a kernel's: no __file__
    with pytest.raises(AssertionError, match=r"(?s)can't import a function defined in a notebook cell.*%%writefile"):
        check_worker_loop(in_a_cell)


def test_check_worker_loop_under_spawn_rejects_what_a_worker_cannot_import():
    with pytest.raises(AssertionError, match=r"(?s)two worker processes \(spawn\).*could not be given your function"):
        check_worker_loop(lambda_loop, start_method="spawn")


def unfinished_loop(dataset, index_queue, result_queue, collate_fn):
    raise NotImplementedError("write worker_loop")


def test_check_worker_loop_names_the_case_when_the_loop_raises():
    with pytest.raises(NotImplementedError, match="write worker_loop") as info:
        check_worker_loop(unfinished_loop)
    assert "after 0 answers, for RangeDataset(10), default_collate, tasks [(0, [0, 1, 2])" in info.value.__notes__[0]


def test_run_worker_processes_gathers_every_answer_and_raises_a_crash_of_the_loop():
    answers = run_worker_processes(simple_worker_loop, toy.FailingDataset(10, bad_index=3),
                                   [(k, [2 * k, 2 * k + 1]) for k in range(5)])
    assert sorted(answers) == [0, 1, 2, 3, 4]
    assert [answers[k].tolist() for k in (0, 2, 3, 4)] == [[0, 1], [4, 5], [6, 7], [8, 9]]
    assert answers[1].exc_type is KeyError
    with pytest.raises(NotImplementedError, match=r"(?s)in worker process \d.*write worker_loop"):
        run_worker_processes(unfinished_loop, toy.RangeDataset(4), [(0, [0]), (1, [1])])


# --- check_prefetcher (ch08) -----------------------------------------------------------------------

IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


def normalise(images, mean, std):
    shape = (1, len(mean), 1, 1)
    return (images.float() - torch.tensor(mean).view(shape) * 255) / (torch.tensor(std).view(shape) * 255)


def test_prefetch_one_ahead_matches_prefetch_loader_and_stays_one_ahead():
    batches = make_image_batches(4, batch_size=3)
    loader = RecordingLoader(batches)
    out = []
    for k, (x, y) in enumerate(prefetch_one_ahead(loader, *IMAGENET)):
        loader.log.append(f"yield {k}")
        out.append((x, y))
    assert loader.log == ["fetch 0", "fetch 1", "yield 0", "fetch 2", "yield 1", "fetch 3", "yield 2", "yield 3"]
    for (x, y), (want_x, want_y) in zip(out, PrefetchLoader(batches, device="cpu")):
        assert torch.equal(x, want_x) and torch.equal(y, want_y)


def test_check_prefetcher_accepts_the_reference(capsys):
    check_prefetcher(prefetch_one_ahead)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


class PrefetcherClass:
    """A class is accepted as well as a generator function."""

    def __init__(self, loader, mean, std):
        self.loader, self.mean, self.std = loader, mean, std

    def __iter__(self):
        held = None
        for images, targets in self.loader:
            upcoming = normalise(images, self.mean, self.std), targets
            if held is not None:
                yield held
            held = upcoming
        if held is not None:
            yield held


def test_check_prefetcher_accepts_a_class_and_another_formula(capsys):
    check_prefetcher(PrefetcherClass)  # (x - 255 m) / (255 s) in another order of operations: close enough
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def lazy(loader, mean, std):
    for images, targets in loader:
        yield normalise(images, mean, std), targets


def drops_the_last_batch(loader, mean, std):
    held = None
    for images, targets in loader:
        if held is not None:
            yield held
        held = normalise(images, mean, std), targets


def forgets_the_255(loader, mean, std):
    shape = (1, len(mean), 1, 1)
    for x, y in prefetch_one_ahead(loader, [0.0] * len(mean), [1 / 255] * len(std)):
        yield (x - torch.tensor(mean).view(shape)) / torch.tensor(std).view(shape), y


def reads_everything_first(loader, mean, std):
    batches = [(normalise(x, mean, std), y) for x, y in loader]
    yield from batches


def in_float64(loader, mean, std):
    for x, y in prefetch_one_ahead(loader, mean, std):
        yield x.double(), y


def crashes_on_an_empty_loader(loader, mean, std):
    it = iter(loader)
    held = next(it)
    for images, targets in it:
        yield normalise(*held[:1], mean, std), held[1]
        held = images, targets
    yield normalise(held[0], mean, std), held[1]


def hands_out_the_new_batch(loader, mean, std):
    held = None
    for images, targets in loader:
        before, held = held, (normalise(images, mean, std), targets)
        if before is not None:
            yield held  # should be `before`
    if held is not None:
        yield held


@pytest.mark.parametrize(
    "wrong, message",
    [
        (lazy, r"when you handed out batch 0, batch 1 had not been fetched yet.*before you yield the current"),
        (drops_the_last_batch, r"has 3 batches, but you yielded 2.*the last batch is missing"),
        (forgets_the_255, r"should be .*, but it is .*scale them by 255"),
        (reads_everything_first, r"already fetched 3 batches.*one batch ahead, no more"),
        (in_float64, r"should have dtype torch.float32, but they have torch.float64"),
        (crashes_on_an_empty_loader, r"an empty loader.*RuntimeError.*next\(iterator, None\)"),
        (hands_out_the_new_batch, r"handed out in place 0 is the loader's batch 1"),
    ],
)
def test_check_prefetcher_rejects_a_wrong_prefetcher_and_says_why(wrong, message):
    with pytest.raises(AssertionError, match=r"check \d+ failed, for ") as info:
        check_prefetcher(wrong)
    assert re.search(message, str(info.value), re.DOTALL), str(info.value)


def test_check_prefetcher_names_the_case_when_the_prefetcher_raises():
    def unfinished(loader, mean, std):
        raise NotImplementedError("write the prefetcher")
        yield

    with pytest.raises(NotImplementedError, match="write the prefetcher") as info:
        check_prefetcher(unfinished)
    assert "3 batches of 2 images" in info.value.__notes__[0]


def hangs_at_the_sentinel(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        result_queue.put((task[0], collate_fn([dataset[i] for i in task[1]])))
    index_queue.get()  # waits for more instead of returning: reads the task after None, then the poison


def waits_at_the_sentinel(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        result_queue.put((task[0], collate_fn([dataset[i] for i in task[1]])))
    threading.Event().wait(10)  # neither reads on nor returns


@pytest.mark.parametrize("wrong, message", [
    (hangs_at_the_sentinel, r"read past the sentinel: it took the task put after None"),
    (waits_at_the_sentinel, r"answered every task but was still running 3 s after the sentinel None"),
])
def test_check_worker_loop_tells_reading_past_the_sentinel_from_not_leaving(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_worker_loop(wrong)


# --- the cheats: an answer that only wraps the library's own implementation is refused --------------


class WrapsMinidlsBatchSampler(SortedBatchSampler):
    def __iter__(self):
        order = sorted(range(len(self.lengths)), key=self.lengths.__getitem__)
        batches = list(BatchSampler(order, self.batch_size, self.drop_last))
        perm = torch.randperm(len(batches), generator=self.generator).tolist() if self.shuffle else range(len(batches))
        return iter([batches[i] for i in perm])


class WrapsTorchsBatchSampler(SortedBatchSampler):
    def __len__(self):
        return len(torch.utils.data.BatchSampler(range(len(self.lengths)), self.batch_size, self.drop_last))


def pads_with_torch(batch):
    seqs = [torch.as_tensor(s["tokens"]) for s in batch]
    mask = [torch.ones(len(s), dtype=torch.bool) for s in seqs]
    pad = torch.nn.utils.rnn.pad_sequence
    return {"tokens": pad(seqs, batch_first=True), "mask": pad(mask, batch_first=True),
            "label": torch.tensor([s["label"] for s in batch])}


def pads_with_minidl(batch):
    from minidl.course.padding import pad_collate

    out = pad_mask_collate(batch)
    out["tokens"] = pad_collate([s["tokens"] for s in batch])
    return out


def wraps_minidls_worker_loop(dataset, index_queue, result_queue, collate_fn):
    from minidl.fetch import _DatasetKind
    from minidl.worker import _worker_loop, _WorkerOptions

    _worker_loop(_DatasetKind.Map, dataset, index_queue, result_queue, threading.Event(), True, collate_fn, False, 0,
                 None, 0, 1, False, _WorkerOptions(worker_method="thread"))


def wraps_prefetch_loader(loader, mean, std):
    yield from PrefetchLoader(loader, device="cpu", mean=mean, std=std, channels=len(mean))


@pytest.mark.parametrize("check, cheat, message", [
    (check_sampler, WrapsMinidlsBatchSampler, r"your sampler called minidl's BatchSampler.*cut the sorted order"),
    (check_sampler, WrapsTorchsBatchSampler, r"your sampler called torch's BatchSampler"),
    (check_collate, pads_with_torch, r"called torch.nn.utils.rnn.pad_sequence.*write it yourself"),
    (check_collate, pads_with_minidl, r"called minidl.course.padding.pad_collate"),
    (check_worker_loop, wraps_minidls_worker_loop, r"called minidl.worker._worker_loop.*write the loop yourself"),
    (check_prefetcher, wraps_prefetch_loader, r"used minidl's PrefetchLoader.*hold-one-back loop yourself"),
])
def test_a_checker_refuses_an_answer_that_wraps_the_library(check, cheat, message):
    rejects(check, cheat, message)


def test_the_prefetch_cheat_would_pass_on_its_outputs_alone():
    """The cheat is refused for delegating, not by accident: its batches are the right ones."""
    batches = make_image_batches(3)
    for (x, y), (want_x, want_y) in zip(wraps_prefetch_loader(batches, *IMAGENET), prefetch_one_ahead(batches,
                                                                                                      *IMAGENET)):
        assert torch.allclose(x, want_x) and torch.equal(y, want_y)


# --- check_slow_sample (ch04) ----------------------------------------------------------------------

from minidl.course.exercises import check_slow_sample, slow_loader  # noqa: E402
from minidl.course.solutions.ch04_slow_sample import find_slow_sample  # noqa: E402


def _duration(row):
    return row["end"] - row["start"]


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


@pytest.mark.parametrize("wrong, message", [
    (reads_the_dataset, r"read the dataset's 'slow_index'.*find it there, by measuring"),
    (slowest_batch, r"said sample 4, but I timed each of the 24 samples myself: sample 17 took \d+ ms.*number of "
                    r"the batch"),
    (started_last, r"said sample 23.*started last, it wasn't the slowest"),
    (assumes_sequential, r"shuffle=True.*this loader shuffles: a sample's place in the epoch is not its index"),
    (diagnoses_before_iterating, r"the trace is empty.*iterate over the loader"),
    (returns_the_row, r"returned a dict.*as a plain int"),
])
def test_check_slow_sample_rejects_a_wrong_finder_and_says_why(wrong, message):
    rejects(check_slow_sample, wrong, message)


# --- check_reorder (ch05) ---------------------------------------------------------------------------

from minidl.course.exercises import Arrivals, check_reorder  # noqa: E402
from minidl.course.exercises.ch05_reorder import due_after  # noqa: E402
from minidl.course.solutions.ch05_reorder import reorder  # noqa: E402


def test_check_reorder_accepts_the_reference(capsys):
    check_reorder(reorder)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def test_due_after_is_the_running_maximum_of_arrival_positions():
    assert due_after([0, 1, 2]) == [1, 2, 3]
    assert due_after([3, 2, 1, 0]) == [4, 4, 4, 4]
    assert due_after([]) == []


def test_reorder_hands_each_batch_out_right_after_the_arrival_that_makes_it_due():
    arrivals = Arrivals([1, 2, 0, 4, 3])
    seen = [(batch, arrivals.taken) for batch in reorder(arrivals)]
    assert seen == [("batch 0", 3), ("batch 1", 3), ("batch 2", 3), ("batch 3", 5), ("batch 4", 5)]


def sorts_everything_first(arrivals):
    for _, batch in sorted(arrivals):
        yield batch


def in_arrival_order(arrivals):
    for _, batch in arrivals:
        yield batch


def if_instead_of_while(arrivals):
    held, due = {}, 0
    for task_idx, batch in arrivals:
        held[task_idx] = batch
        if due in held:
            yield held.pop(due)
            due += 1


def yields_pairs(arrivals):
    for batch in reorder(arrivals):
        yield int(batch.split()[1]), batch


def through_a_dataloader(arrivals):
    held = dict(arrivals)
    yield from minidl.DataLoader([held[k] for k in range(len(held))], batch_size=None)


@pytest.mark.parametrize("wrong, message", [
    (through_a_dataloader, r"your reorder ran minidl's DataLoader.*_task_info and _rcvd_idx"),
    (sorts_everything_first, r"arrival order \[0, 1, 2\].*batch 0 was due after 1 arrivals, but you had read 3.*read "
                             r"every arrival before handing anything out"),
    (in_arrival_order, r"arrival order \[1, 0, 2\].*output 0 should be 'batch 0', but it is 'batch 1'.*by task "
                       r"number, not in arrival order"),
    (if_instead_of_while, r"batch 1 was due after 2 arrivals, but you had read 3.*while loop"),
    (yields_pairs, r"output 0 should be 'batch 0', but it is \(0, 'batch 0'\).*yield the batch alone"),
])
def test_check_reorder_rejects_a_wrong_reorder_and_says_why(wrong, message):
    rejects(check_reorder, wrong, message)


# --- check_worker_init_fn (ch06, sharding) -------------------------------------------------------------

from minidl.course.exercises import check_worker_init_fn, range_stream  # noqa: E402
from minidl.course.solutions.ch06_sharding import shard_worker_init_fn  # noqa: E402


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

from minidl.course.exercises import AugmentedDataset, check_worker_seeding  # noqa: E402
from minidl.course.solutions.ch06_seeding import seed_worker  # noqa: E402


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


def minidls_info_for_seeding(worker_id):
    info = minidl.get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


@pytest.mark.parametrize("wrong, message", [
    (takes_info_rng, r"read get_worker_info\(\).rng.*the loader's own per-worker generator"),
    (toy.seed_numpy_from_worker, r"called toy.seed_numpy_from_worker.*reseeds NumPy's global stream"),
    (does_nothing, r"still draws .* as it did before your worker_init_fn.*reseed the worker's own copy"),
    (reseeds_numpys_global, r"still draws.*you reseeded NumPy's global stream.*dataset.rng"),
    (seeds_from_worker_id, r"worker 0 in two epochs.*not from worker_id alone"),
    (seeds_from_the_os, r"called twice with the same info.seed.*not from the clock or the OS"),
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


def test_your_turn_raised_in_a_worker_still_shows_as_its_message():
    def unwritten(worker_id):
        raise YourTurn()

    with pytest.raises(YourTurn) as info:
        list(minidl.DataLoader(AugmentedDataset(4), num_workers=1, worker_init_fn=unwritten))
    assert info.value._render_traceback_() == [f"YourTurn: {YourTurn.MESSAGE} (raised in a worker)"]


from minidl.course.exercises import YourTurn, call_as_worker  # noqa: E402
