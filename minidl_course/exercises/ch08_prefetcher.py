"""Checker for ch08_prefetcher: a generator one batch ahead that normalises images, held to the formula in float64."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from minidl.dataloader import DataLoader
from minidl_course.exercises._common import _Checks, _short, _torch, _type_name

DELEGATED = "your prefetcher hands the work to {0}: write the hold-one-back loop yourself."
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


def make_image_batches(n_batches: int, batch_size: int = 4, channels: int = 3, size: tuple[int, int] = (4, 4),
                       seed: int = 0) -> list[tuple[Any, Any]]:
    """``n_batches`` batches ``(uint8 images (B, C, H, W), int64 targets)``; targets number the samples 0, 1, ...
    >>> [(tuple(x.shape), x.dtype, y.tolist()) for x, y in make_image_batches(2, batch_size=2, size=(3, 3))]
    [((2, 3, 3, 3), torch.uint8, [0, 1]), ((2, 3, 3, 3), torch.uint8, [2, 3])]
    """
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 256, (batch_size, channels, *size), dtype=torch.uint8, generator=g),
             torch.arange(k * batch_size, (k + 1) * batch_size)) for k in range(n_batches)]


class RecordingLoader:
    """Ready-made batches, each noted in ``log`` ("fetch 0", ...) as it is handed out; others may log there too."""

    def __init__(self, batches: Sequence[Any], log: list[str] | None = None) -> None:
        self.batches, self.log = batches, [] if log is None else log
        self.fetched, self.passes = 0, 0  # batches handed out so far, over all passes; iter() calls

    def __iter__(self) -> Iterator[Any]:
        self.passes += 1
        for k, batch in enumerate(self.batches):
            self.log.append(f"fetch {k}")
            self.fetched += 1
            yield batch

    def __len__(self) -> int:
        return len(self.batches)


def _cases() -> Iterator[tuple[str, list[tuple[Any, Any]], list[float], list[float]]]:
    """(description, batches, mean, std): small readable cases first, then seeded random ones."""
    yield "3 batches of 2 images, 3x4x4, ImageNet statistics", make_image_batches(3, 2), *IMAGENET
    yield "1 batch", make_image_batches(1, 2), *IMAGENET
    yield "2 batches", make_image_batches(2, 3, seed=1), *IMAGENET
    yield "an empty loader (no batches)", [], *IMAGENET
    yield "5 batches of 1 grey image, 1x2x3", make_image_batches(5, 1, 1, (2, 3), seed=2), [0.5], [0.25]
    rng = random.Random(0)
    for seed in range(30):
        n, size, channels, shape = rng.randint(0, 7), rng.randint(1, 4), rng.choice((1, 3)), (rng.randint(1, 5),
                                                                                               rng.randint(1, 5))
        mean, std = ([round(rng.uniform(lo, hi), 3) for _ in range(channels)] for lo, hi in ((0.2, 0.8), (0.1, 0.4)))
        yield (f"{n} batches of {size} images, {channels}x{shape[0]}x{shape[1]}, make_image_batches seed {seed}",
               make_image_batches(n, size, channels, shape, seed=seed), mean, std)


def check_prefetcher(prefetcher: Callable[..., Iterable[Any]]) -> None:
    """Check ch08_prefetcher: ``prefetcher(loader, mean, std)`` one batch ahead, normalised; then over a DataLoader."""
    from minidl.prefetch import PrefetchLoader, fast_collate
    checks = _Checks(prefetcher)
    library = {"minidl's PrefetchLoader": (PrefetchLoader,)}
    for case in _cases():
        _check_case(prefetcher, library, checks, *case)
        checks.passed += 1
    rng = np.random.default_rng(5)
    samples = [(rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8), i) for i in range(10)]  # HWC images
    loader = DataLoader(samples, batch_size=4, collate_fn=functools.partial(fast_collate, channels_last=True))
    case = "minidl.DataLoader(10 HWC uint8 images, batch_size=4, collate_fn=fast_collate(channels_last=True))"
    got = checks.watched(library, case, "your prefetcher used {0}", DELEGATED,
                         lambda: list(prefetcher(loader, *IMAGENET)), what="prefetcher")
    _compare(got, list(loader), *IMAGENET, case, checks)
    checks.passed += 1
    checks.done()


def _check_case(prefetcher, library, checks: _Checks, description, batches, mean, std) -> None:
    """Run ``prefetcher`` over a RecordingLoader of ``batches``: what it fetched and normalised before each yield."""
    torch, case, n, log = _torch(), f"{description}, mean={mean}, std={std}", len(batches), []
    untouched = [(x.clone(), y.clone()) for x, y in batches]
    loader, got, late = RecordingLoader(_watched(batches, log), log), [], []
    def run() -> None:
        for k, item in enumerate(prefetcher(loader, mean, std)):
            log.append(f"yield {k}")
            fetched, order = loader.fetched, f"(order so far: {', '.join(log)})"
            got.append(item)
            checks.first(case, (k + 1 < n and fetched < k + 2, f"when you handed out batch {k}, batch {k + 1} had "
                                f"not been fetched yet {order}", "take the next batch from the loader (and normalise "
                                "it) before you yield the current one; that is what prefetching means."),
                         (fetched > k + 2, f"when you handed out batch {k}, you had already fetched {fetched} batches "
                          f"{order}", "stay one batch ahead, no more: every batch held costs memory (GPU memory, on a "
                          "GPU)."))
            if k + 1 < n and f"normalise {k + 1}" not in log and not late:
                late.append(f"when you handed out batch {k}, batch {k + 1} was fetched but not yet normalised {order}")
            if k >= n:
                break
    checks.watched(library, case, "your prefetcher used {0}", DELEGATED, run, what="prefetcher", explain=lambda e:
                   checks.first(case, (isinstance(e, RuntimeError) and "StopIteration" in str(e), f"your prefetcher "
                                f"raised RuntimeError: {e}", "a generator turns the StopIteration of next() on an "
                                "exhausted iterator into this error: use next(iterator, None), or a for loop.")))
    checks.first(case, (loader.passes != 1, f"you iterated the loader {loader.passes} times for one pass over the data",
                        "loop over the loader once: a DataLoader starts a new epoch (and workers) on each iter()."),
                 *((not (torch.equal(x, x0) and torch.equal(y, y0)), f"batch {k} of the loader was changed in place",
                    "make a new tensor for the normalised images; never write into the loader's batches.")
                   for k, ((x, y), (x0, y0)) in enumerate(zip(batches, untouched))))
    _compare(got, batches, mean, std, case, checks)
    if late:  # all else right: the work is done, but late
        checks.fail(case, late[0], "normalise a batch as soon as you fetch it, before you yield the one you hold.")


def _watched(batches: Sequence[tuple[Any, Any]], log: list[str]) -> list[tuple[Any, Any]]:
    """``batches`` whose images note in ``log`` ("normalise k") each operation that makes floats from them."""
    torch = _torch()
    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            with torch._C.DisableTorchFunctionSubclass():  # results are plain tensors
                out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                log.extend(f"normalise {a.batch_index}" for a in torch.utils._pytree.tree_leaves((args, kwargs))
                           if isinstance(a, cls))
            return out
    out = [(images.as_subclass(Watched), targets) for images, targets in batches]
    for k, (images, _) in enumerate(out):
        images.batch_index = k
    return out


def _compare(got, batches, mean, std, case, checks: _Checks) -> None:
    """Each of the loader's batches as ``(x - 255 mean[c]) / (255 std[c])`` gives it, in float64 then float32."""
    torch = _torch()
    centre, spread = (torch.tensor(v, dtype=torch.float64).view(1, len(v), 1, 1) * 255 for v in (mean, std))
    expected = [(((x.to(torch.float64) - centre) / spread).to(torch.float32), y) for x, y in batches]
    checks.first(case, (len(got) != len(expected), f"the loader has {len(expected)} batches, but you yielded "
                        f"{len(got)}", "the last batch is missing: when the loop over the loader ends, yield the batch "
                        "still held." if len(got) == len(expected) - 1 else "each batch is handed out exactly once."))
    for k, (item, (want_x, want_y)) in enumerate(zip(got, expected)):
        checks.first(case, (not isinstance(item, tuple | list) or len(item) != 2, f"batch {k} should be a pair "
                            f"(images, targets), but it is {_short(item)}", ""))
        (x, y), y_ok = item, isinstance(item[1], torch.Tensor) and torch.equal(item[1], want_y)
        checks.first(case, (not isinstance(x, torch.Tensor), f"batch {k}'s images should be a torch.Tensor, but they "
                            f"are {_type_name(x)}", ""))
        moved = next((j for j, (_, t) in enumerate(batches) if isinstance(y, torch.Tensor) and torch.equal(y, t)), None)
        checks.first(case, (x.dtype != torch.float32, f"batch {k}'s images should have dtype torch.float32, but they "
                            f"have {x.dtype}", "convert with images.float(), and keep mean and std float32 too."),
                     (x.shape != want_x.shape, f"batch {k}'s images should have shape {tuple(want_x.shape)}, but they "
                      f"have {tuple(x.shape)}", f"normalise with the mean and std you are given, one value per channel "
                      f"(here {len(mean)}), not your own." if x.ndim == 4 and x.shape[1] != want_x.shape[1]
                      else "normalising changes values, never the shape (N, C, H, W)."),
                     (not y_ok and moved is not None, f"the batch you handed out in place {k} is the loader's batch "
                      f"{moved}", "keep the loader's order: yield the batch you held, then hold the new one."),
                     (not y_ok, f"batch {k}'s targets should be {want_y.tolist()}, but they are {_short(y)}",
                      "pass the targets through untouched."))
        if not torch.allclose(x, want_x, rtol=1e-5, atol=1e-5):
            i = tuple(int(v) for v in torch.nonzero(~torch.isclose(x, want_x, rtol=1e-5, atol=1e-5))[0])
            raw, m, s = int(batches[k][0][i]), mean[i[1]], std[i[1]]
            checks.fail(case, f"batch {k}'s images{list(i)} should be {float(want_x[i]):.5f}, but it is "
                        f"{float(x[i]):.5f}", "mean and std are for images scaled to [0, 1], and these are 0..255: "
                        "scale them by 255, (x - mean * 255) / (std * 255)." if abs(float(x[i]) - (raw - m) / s) < 1e-3
                        else f"the raw value there is {raw} (channel {i[1]}, mean {m}, std {s}): ({raw} - {m} * 255) "
                        f"/ ({s} * 255) = {float(want_x[i]):.4f}.")
