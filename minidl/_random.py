"""Random numbers drawn the way torch draws them, or from NumPy when torch is absent.

minidl promises the same order as ``torch.utils.data`` for the same seed, so with torch installed
every draw goes through torch's own generator. Without torch, on a free-threaded interpreter for example,
the same calls fall back to NumPy. They are still reproducible, but they draw a different stream than torch's.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

HAS_TORCH = importlib.util.find_spec("torch") is not None

Generator = Any  # a torch.Generator, a numpy.random.Generator, or None


def _torch():
    import torch  # imported on the first draw, because `import minidl` must work without torch

    return torch


def _uses_numpy(generator: Generator) -> bool:
    return isinstance(generator, np.random.Generator) or not HAS_TORCH


def _numpy_generator(generator: Generator) -> np.random.Generator:
    if generator is not None:
        return generator
    # With no generator given, a fresh one is seeded from NumPy's global state.
    # So np.random.seed(s) plays the part that torch.manual_seed(s) plays with torch.
    return np.random.default_rng(np.random.randint(0, 2**63 - 1, dtype=np.int64))


def make_generator(seed: int) -> Generator:
    """A new generator seeded with ``seed``. It is torch's when torch is installed, and NumPy's otherwise."""
    if HAS_TORCH:
        g = _torch().Generator()
        g.manual_seed(seed)
        return g
    # torch accepts negative seeds and wraps them to 64 bits. NumPy only takes non-negative ones.
    return np.random.default_rng(seed % 2**64)


def draw_seed(generator: Generator = None) -> int:
    """A random signed 64-bit seed, as ``torch.empty((), dtype=torch.int64).random_()`` draws it."""
    if _uses_numpy(generator):
        return int(_numpy_generator(generator).integers(0, 2**63 - 1))
    torch = _torch()
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def randperm(n: int, generator: Generator = None) -> list[int]:
    """A random permutation of ``range(n)``, as ``torch.randperm(n).tolist()``."""
    if _uses_numpy(generator):
        return _numpy_generator(generator).permutation(n).tolist()
    return _torch().randperm(n, generator=generator).tolist()


def randint(high: int, size: int, generator: Generator = None) -> list[int]:
    """``size`` integers drawn uniformly from ``[0, high)``."""
    if _uses_numpy(generator):
        return _numpy_generator(generator).integers(0, high, size=size).tolist()
    torch = _torch()
    return torch.randint(high=high, size=(size,), dtype=torch.int64, generator=generator).tolist()


def multinomial(weights, num_samples: int, replacement: bool, generator: Generator = None) -> list[int]:
    """Indices drawn with probability proportional to ``weights``, as ``torch.multinomial``."""
    if _uses_numpy(generator):
        p = np.asarray(weights, dtype=np.float64)
        _check_distribution(p, num_samples, replacement)
        rng = _numpy_generator(generator)
        if replacement:
            return rng.choice(len(p), size=num_samples, p=p / p.sum()).tolist()
        # Without replacement, torch keeps the top k of p / Exp(1). This is the exponential trick.
        # So zero weights are still drawn, last, once the positive ones run out. We do the same.
        keys = p / rng.exponential(size=len(p))
        return np.argsort(-keys, kind="stable")[:num_samples].tolist()
    torch = _torch()
    w = torch.as_tensor(weights, dtype=torch.double)
    return torch.multinomial(w, num_samples, replacement, generator=generator).tolist()


def _check_distribution(p: np.ndarray, num_samples: int, replacement: bool) -> None:
    """The checks ``torch.multinomial`` makes on CPU, in its order, with its exception type and messages (torch 2.13).

    Without replacement, or for a single draw, torch checks the whole vector at once. With replacement, its
    kernel checks entry by entry, so there a NaN reads as an entry below zero.
    """
    if not replacement and num_samples > p.size:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if p.size > 2**24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    if not replacement or num_samples == 1:
        if p.size == 0:
            raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the operation has no "
                               "identity.")
        if not (p.max() < np.inf and p.min() >= 0):  # a NaN fails both comparisons
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        if p.sum() == 0:
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
        return
    for value in p[~((p >= 0) & np.isfinite(p))][:1]:  # the first bad entry, if any
        if not value >= 0:
            raise RuntimeError("invalid multinomial distribution (encountering probability entry < 0)")
        raise RuntimeError("invalid multinomial distribution (encountering probability entry = infinity or NaN)")
    if not p.sum() > 0:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
