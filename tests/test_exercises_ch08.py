"""The exercise checkers, ch08 (a prefetcher that stays one batch ahead): each passes a learner's copy of the
reference answer and rejects typical wrong answers with the hint that names the mistake.
"""

import re

import pytest
import torch
from exercise_support import (
    IMAGENET,
    learner_copy,
    rejects,
)

from minidl.prefetch import PrefetchLoader
from minidl_course.exercises import (
    RecordingLoader,
    check_prefetcher,
    make_image_batches,
)

prefetch_one_ahead = learner_copy("ch08_prefetcher").prefetch


# --- check_prefetcher (ch08) -----------------------------------------------------------------------



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


def uses_imagenet_statistics(loader, mean, std):
    yield from prefetch_one_ahead(loader, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


def reads_everything_first(loader, mean, std):
    batches = [(normalise(x, mean, std), y) for x, y in loader]
    yield from batches


def in_float64(loader, mean, std):
    for x, y in prefetch_one_ahead(loader, mean, std):
        yield x.double(), y


def crashes_on_an_empty_loader(loader, mean, std):
    it = iter(loader)
    images, targets = next(it)
    held = normalise(images, mean, std), targets
    for images, targets in it:
        upcoming = normalise(images, mean, std), targets
        yield held
        held = upcoming
    yield held


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
        (uses_imagenet_statistics, r"should have shape \(\d+, 1, \d+, \d+\).*the mean and std you are given"),
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


# --- fetched ahead, but normalised late ---------------------------------------------------------------------


def normalises_when_it_yields(loader, mean, std):
    shape = (1, len(mean), 1, 1)
    scale = torch.tensor([m * 255 for m in mean], dtype=torch.float32).view(shape)
    spread = torch.tensor([s * 255 for s in std], dtype=torch.float32).view(shape)
    held = None
    for images, targets in loader:
        if held is not None:
            yield (held[0].to(torch.float32) - scale) / spread, held[1]  # the work done only now
        held = (images, targets)
    if held is not None:
        yield (held[0].to(torch.float32) - scale) / spread, held[1]


def test_check_prefetcher_refuses_one_that_fetches_ahead_but_normalises_late():
    rejects(check_prefetcher, normalises_when_it_yields,
            r"when you handed out batch 0, batch 1 was fetched but not yet normalised.*normalise a batch as soon")
