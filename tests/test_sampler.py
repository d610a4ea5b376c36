"""Tests for minidl/sampler.py: torch.utils.data is the oracle, hypothesis checks the invariants."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl._random
import minidl.sampler
from minidl.sampler import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

try:
    import torch
    import torch.utils.data as tud
except ImportError:  # the NumPy-only tests below still run
    torch = tud = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is the oracle")
few = settings(max_examples=50, deadline=None)

SIZES = [1, 2, 7, 31, 32, 33, 100]
SEEDS = [0, 1, 1234]


def tgen(seed):
    return torch.Generator().manual_seed(seed)


# --- same order as torch -------------------------------------------------------------------------


@needs_torch
def test_sequential_matches_torch():
    for n in [0, 1, 5]:
        assert list(SequentialSampler(range(n))) == list(tud.SequentialSampler(range(n)))
        assert len(SequentialSampler(range(n))) == n


@needs_torch
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("replacement", [False, True])
def test_random_sampler_matches_torch(n, replacement):
    for seed, num_samples in itertools.product(SEEDS, [None, 1, n, 2 * n + 3, 31, 32, 33, 65]):
        ours = RandomSampler(range(n), replacement, num_samples, generator=tgen(seed))
        theirs = tud.RandomSampler(range(n), replacement, num_samples, generator=tgen(seed))
        assert len(ours) == len(theirs)
        # Two epochs from one generator: both must consume it identically.
        assert list(ours) == list(theirs)
        assert list(ours) == list(theirs)


@needs_torch
@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("num_samples", [None, 5, 40])
def test_random_sampler_without_generator_follows_global_seed(replacement, num_samples):
    for seed in SEEDS:
        torch.manual_seed(seed)
        ours = list(RandomSampler(range(13), replacement, num_samples))
        torch.manual_seed(seed)
        theirs = list(tud.RandomSampler(range(13), replacement, num_samples))
        assert ours == theirs


@needs_torch
@pytest.mark.parametrize("indices", [[], [4], [9, 3, 7, 1], list(range(50, 0, -3))])
def test_subset_random_sampler_matches_torch(indices):
    for seed in SEEDS:
        assert list(SubsetRandomSampler(indices, tgen(seed))) == list(
            tud.SubsetRandomSampler(indices, tgen(seed))
        )
    torch.manual_seed(5)
    ours = list(SubsetRandomSampler(indices))
    torch.manual_seed(5)
    assert ours == list(tud.SubsetRandomSampler(indices))


WEIGHTS = [[1.0], [0.1, 0.9, 0.4, 0.7, 3.0, 0.6], [0.0, 2.0, 0.0, 1.0, 5.0], list(range(1, 40))]


@needs_torch
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("replacement", [False, True])
def test_weighted_sampler_matches_torch(weights, replacement):
    for seed, num_samples in itertools.product(SEEDS, [1, 3, len(weights), 50]):
        if not replacement and num_samples > len(weights):
            continue
        ours = WeightedRandomSampler(weights, num_samples, replacement, tgen(seed))
        theirs = tud.WeightedRandomSampler(weights, num_samples, replacement, tgen(seed))
        assert len(ours) == len(theirs)
        assert list(ours) == list(theirs)
    # Tensors and arrays are accepted as weights too, and draw the same.
    as_tensor = torch.tensor(weights, dtype=torch.float32)
    ours = WeightedRandomSampler(as_tensor, 1, replacement, tgen(3))
    assert list(ours) == list(tud.WeightedRandomSampler(as_tensor, 1, replacement, tgen(3)))
    ours = WeightedRandomSampler(np.array(weights), 1, replacement, tgen(3))
    assert list(ours) == list(tud.WeightedRandomSampler(weights, 1, replacement, tgen(3)))


@needs_torch
@pytest.mark.parametrize("replacement", [False, True])
def test_weighted_sampler_with_a_subnormal_weight_draws_what_torch_draws(replacement):
    # Without replacement, torch divides each weight by a random draw: 5e-324 underflows to 0 and ties with the
    # zero weights, so torch can draw a zero-weight index. minidl follows it, index for index.
    weights = [0.0, 0.0, 0.0, 5e-324]
    for seed in SEEDS:
        ours = WeightedRandomSampler(weights, 1, replacement, tgen(seed))
        assert list(ours) == list(tud.WeightedRandomSampler(weights, 1, replacement, tgen(seed)))


@needs_torch
@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 64])
@pytest.mark.parametrize("batch_size", [1, 3, 10, 100])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_matches_torch(n, batch_size, drop_last):
    ours = BatchSampler(SequentialSampler(range(n)), batch_size, drop_last)
    theirs = tud.BatchSampler(tud.SequentialSampler(range(n)), batch_size, drop_last)
    assert list(ours) == list(theirs)
    assert len(ours) == len(theirs)
    if n:
        ours = BatchSampler(RandomSampler(range(n), generator=tgen(n)), batch_size, drop_last)
        theirs = tud.BatchSampler(tud.RandomSampler(range(n), generator=tgen(n)), batch_size, drop_last)
        assert list(ours) == list(theirs)


# --- invariants ----------------------------------------------------------------------------------


@few
@given(n=st.integers(1, 60), seed=st.integers(0, 2**32), blocks=st.integers(0, 3), extra=st.integers(0, 59))
def test_random_sampler_permutes_in_blocks(n, seed, blocks, extra):
    num_samples = blocks * n + extra % n or n
    g = minidl._random.make_generator(seed)
    out = list(RandomSampler(range(n), num_samples=num_samples, generator=g))
    assert len(out) == num_samples
    # Every whole block of n is a permutation; the tail has no repeats.
    for start in range(0, num_samples, n):
        block = out[start : start + n]
        assert len(set(block)) == len(block)
    assert set(out) <= set(range(n))
    if num_samples >= n:
        assert sorted(out[:n]) == list(range(n))


@few
@given(n=st.integers(1, 50), num_samples=st.integers(1, 100), seed=st.integers(0, 2**32))
def test_random_sampler_with_replacement_stays_in_range(n, num_samples, seed):
    g = minidl._random.make_generator(seed)
    out = list(RandomSampler(range(n), replacement=True, num_samples=num_samples, generator=g))
    assert len(out) == num_samples and all(0 <= i < n for i in out)


@few
@given(indices=st.lists(st.integers(-5, 1000), unique=True, max_size=40), seed=st.integers(0, 2**32))
def test_subset_random_sampler_visits_each_index_once(indices, seed):
    out = list(SubsetRandomSampler(indices, minidl._random.make_generator(seed)))
    assert sorted(out) == sorted(indices)


@few
@given(
    # No subnormal weights: torch.multinomial without replacement divides each weight by a random draw, so a
    # weight of 5e-324 underflows to 0 and ties with the zeros (torch itself then draws index 0; minidl does too).
    weights=st.lists(st.floats(0, 10, allow_subnormal=False), min_size=1, max_size=30).filter(lambda w: sum(w) > 0),
    num_samples=st.integers(1, 30),
    replacement=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_weighted_sampler_draws_only_positive_weights(weights, num_samples, replacement, seed):
    positive = [i for i, w in enumerate(weights) if w > 0]
    if not replacement:
        num_samples = min(num_samples, len(positive))
    g = minidl._random.make_generator(seed)
    out = list(WeightedRandomSampler(weights, num_samples, replacement, g))
    assert len(out) == num_samples
    assert set(out) <= set(positive)
    if not replacement:
        assert len(set(out)) == num_samples


@few
@given(n=st.integers(0, 100), batch_size=st.integers(1, 20), drop_last=st.booleans())
def test_batch_sampler_partitions_the_sampler(n, batch_size, drop_last):
    batches = list(BatchSampler(range(n), batch_size, drop_last))
    assert len(batches) == len(BatchSampler(range(n), batch_size, drop_last))
    assert all(len(b) == batch_size for b in batches[:-1])
    flat = [i for b in batches for i in b]
    if drop_last:
        assert len(batches) == n // batch_size and all(len(b) == batch_size for b in batches)
        assert flat == list(range(n // batch_size * batch_size))
    else:
        assert len(batches) == -(-n // batch_size)
        assert flat == list(range(n))


# --- bad input: same exception type as torch, a message naming the argument ------------------------

BAD = [
    (lambda m: m.RandomSampler(range(3), replacement=1), TypeError, "replacement"),
    (lambda m: m.RandomSampler(range(3), replacement="yes"), TypeError, "replacement"),
    (lambda m: m.RandomSampler(range(3), num_samples=0), ValueError, "num_samples"),
    (lambda m: m.RandomSampler(range(3), num_samples=-2), ValueError, "num_samples"),
    (lambda m: m.RandomSampler(range(3), num_samples=1.5), ValueError, "num_samples"),
    (lambda m: m.RandomSampler([]), ValueError, "num_samples"),
    (lambda m: m.BatchSampler(range(3), batch_size=0, drop_last=False), ValueError, "batch_size"),
    (lambda m: m.BatchSampler(range(3), batch_size=-1, drop_last=False), ValueError, "batch_size"),
    (lambda m: m.BatchSampler(range(3), batch_size=True, drop_last=False), ValueError, "batch_size"),
    (lambda m: m.BatchSampler(range(3), batch_size=2.0, drop_last=False), ValueError, "batch_size"),
    (lambda m: m.BatchSampler(range(3), batch_size=2, drop_last=0), ValueError, "drop_last"),
    (lambda m: m.BatchSampler(range(3), batch_size=2, drop_last=None), ValueError, "drop_last"),
    (lambda m: m.WeightedRandomSampler([1.0, 2.0], 0), ValueError, "num_samples"),
    (lambda m: m.WeightedRandomSampler([1.0, 2.0], True), ValueError, "num_samples"),
    (lambda m: m.WeightedRandomSampler([1.0, 2.0], 2.0), ValueError, "num_samples"),
    (lambda m: m.WeightedRandomSampler([1.0, 2.0], 1, replacement=1), ValueError, "replacement"),
    (lambda m: m.WeightedRandomSampler([[1.0, 2.0], [3.0, 4.0]], 1), ValueError, "weights"),
    (lambda m: m.WeightedRandomSampler(3.0, 1), ValueError, "weights"),
]


@pytest.mark.parametrize("make, error, name", BAD)
def test_bad_input_raises_like_torch(make, error, name):
    with pytest.raises(error, match=name):
        make(minidl.sampler)
    if tud is not None:
        with pytest.raises(error):
            list(make(tud))  # torch may raise at construction or only when iterating



# --- weights: accepted and refused as torch accepts and refuses them ------------------------------


def weighted_outcome(lib, weights, num_samples, replacement, generator):
    """What a WeightedRandomSampler of ``lib`` does: its draws, or where it raised, what and in which words."""
    try:
        sampler = lib.WeightedRandomSampler(weights, num_samples, replacement, generator)
    except Exception as e:  # noqa: BLE001 - any exception is an outcome to compare
        return "at construction", type(e), str(e)
    try:
        return "drew", list(sampler)
    except Exception as e:  # noqa: BLE001
        return "at the first draw", type(e), str(e)


WEIGHT_CASES = {  # each builds fresh weights
    "a negative weight": lambda: [1.0, -1.0, 2.0],
    "NaN": lambda: [1.0, float("nan")],
    "infinity": lambda: [float("inf"), 1.0],
    "all zero": lambda: [0.0, 0.0],
    "empty": lambda: [],
    "ragged": lambda: [[1.0], [1.0, 2.0]],
    "text": lambda: ["a", "b"],
    "numbers as text": lambda: ["1.0", "2.0"],
    "None inside": lambda: [1.0, None],
    "a string": lambda: "ab",
    "an object array": lambda: np.array([1.0, 2.0], dtype=object),
    "a tensor that requires grad": lambda: torch.tensor([1.0, 3.0], requires_grad=True),
    "ints and bools": lambda: [1, True, 0],
}


@needs_torch
@pytest.mark.parametrize("case", WEIGHT_CASES)
@pytest.mark.parametrize(("num_samples", "replacement"), [(1, True), (2, True), (2, False), (3, False)])
def test_weights_are_accepted_or_refused_like_torch(case, num_samples, replacement):
    weights = WEIGHT_CASES[case]
    ours = weighted_outcome(minidl.sampler, weights(), num_samples, replacement, tgen(0))
    assert ours == weighted_outcome(tud, weights(), num_samples, replacement, tgen(0))


NUMBERS = st.one_of(st.floats(width=64), st.integers(-3, 3), st.booleans())
ANYTHING = st.one_of(NUMBERS, st.none(), st.text(max_size=2), st.binary(max_size=2),
                     st.complex_numbers(max_magnitude=2))
WEIGHTS = st.one_of(
    st.lists(NUMBERS, max_size=6),  # what people pass, bad values included
    st.lists(ANYTHING, max_size=4),  # and anything at all inside a list
    st.lists(st.lists(NUMBERS, max_size=3), max_size=3),  # 2-d, and ragged
    ANYTHING,  # a lone value
    st.lists(st.floats(width=64), max_size=6).map(np.array),
    st.lists(st.floats(width=32), max_size=6).map(lambda w: torch.tensor(w, dtype=torch.float32) if torch else w),
)


@needs_torch
@settings(max_examples=300, deadline=None)
@given(weights=WEIGHTS, num_samples=st.integers(1, 8), replacement=st.booleans(), seed=st.integers(0, 2**32))
def test_any_weights_are_accepted_or_refused_like_torch(weights, num_samples, replacement, seed):
    ours = weighted_outcome(minidl.sampler, weights, num_samples, replacement, tgen(seed))
    assert ours == weighted_outcome(tud, weights, num_samples, replacement, tgen(seed))


@needs_torch
@settings(max_examples=300, deadline=None)
@given(weights=st.lists(st.one_of(st.floats(-1e300, 1e300), st.sampled_from([float("nan"), float("inf")])),
                        max_size=6),
       num_samples=st.integers(1, 8), replacement=st.booleans())
def test_a_numpy_generator_refuses_the_weights_torch_refuses_in_its_words(weights, num_samples, replacement):
    # With a NumPy generator minidl draws with NumPy, so the checks torch.multinomial makes are minidl's own.
    ours = weighted_outcome(minidl.sampler, weights, num_samples, replacement, np.random.default_rng(0))
    theirs = weighted_outcome(tud, weights, num_samples, replacement, tgen(0))
    assert ours[0] == theirs[0]
    assert ours[1:] == theirs[1:] or ours[0] == "drew"


def test_without_torch_weights_that_are_not_numbers_are_refused(monkeypatch):
    monkeypatch.setattr(minidl._random, "HAS_TORCH", False)
    for weights in (["a", "b"], [1.0, None], "ab", np.array(["1.0"])):
        with pytest.raises(TypeError):
            WeightedRandomSampler(weights, 1)
    with pytest.raises(ValueError):
        WeightedRandomSampler([[1.0], [1.0, 2.0]], 1)
    assert isinstance(WeightedRandomSampler([1, True, 0.5], 1).weights, np.ndarray)
    with pytest.raises(RuntimeError, match="element < 0"):
        list(WeightedRandomSampler([1.0, -1.0], 1))

# --- the NumPy path ------------------------------------------------------------------------------


def test_numpy_generator_is_reproducible_and_covers():
    def draw(cls, *args, **kwargs):
        return list(cls(*args, **kwargs, generator=np.random.default_rng(0)))

    assert draw(RandomSampler, range(20)) == draw(RandomSampler, range(20))
    assert sorted(draw(RandomSampler, range(20))) == list(range(20))
    counts = np.bincount(draw(RandomSampler, range(20), num_samples=45), minlength=20)
    assert sorted(counts) == [2] * 15 + [3] * 5  # two whole permutations, then 5 more
    with_replacement = draw(RandomSampler, range(7), replacement=True, num_samples=70)
    assert with_replacement == draw(RandomSampler, range(7), replacement=True, num_samples=70)
    assert len(with_replacement) == 70 and set(with_replacement) <= set(range(7))
    assert sorted(draw(SubsetRandomSampler, [5, 1, 8])) == [1, 5, 8]
    weighted = draw(WeightedRandomSampler, [0.0, 1.0, 3.0, 0.0], 50)
    assert weighted == draw(WeightedRandomSampler, [0.0, 1.0, 3.0, 0.0], 50)
    assert set(weighted) == {1, 2}
    # As in torch, zero weights are drawn last once the positive ones run out.
    assert sorted(draw(WeightedRandomSampler, [0.0, 1.0, 3.0, 0.0], 4, replacement=False)) == [0, 1, 2, 3]
    assert set(draw(WeightedRandomSampler, [0.0, 1.0, 3.0, 0.0], 2, replacement=False)) == {1, 2}


def test_without_torch(monkeypatch):
    monkeypatch.setattr(minidl._random, "HAS_TORCH", False)
    assert isinstance(minidl._random.make_generator(0), np.random.Generator)

    np.random.seed(7)
    first = list(RandomSampler(range(30)))
    np.random.seed(7)
    assert list(RandomSampler(range(30))) == first
    assert sorted(first) == list(range(30))
    assert len(list(RandomSampler(range(5), replacement=True, num_samples=100))) == 100
    assert sorted(SubsetRandomSampler([3, 1, 2])) == [1, 2, 3]
    assert set(WeightedRandomSampler([1.0, 0.0, 2.0], 20)) <= {0, 2}
    assert list(BatchSampler(RandomSampler(range(7)), 3, drop_last=True)) != []
    g = minidl._random.make_generator(-1)  # torch takes negative seeds; the NumPy path wraps them
    assert sorted(RandomSampler(range(4), generator=g)) == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="prob_dist"):
        minidl._random.multinomial([1.0, 2.0], 3, False, None)
