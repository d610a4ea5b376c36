"""Mistakes the course makes on purpose, as functions a worker process can import.

A ``multiprocessing.Pool`` runs only what it can import by name (under ``spawn`` and ``forkserver``
it cannot see a notebook cell), so the deliberate mistakes that notebook 06 shows live here.
Nothing else in minidl uses this module, and it mirrors no file of PyTorch.
"""

from __future__ import annotations

import os
import random

import numpy as np


def global_draws(n: int = 2) -> tuple[int, dict[str, list[float]]]:
    """This process's pid and ``n`` draws from each global stream a random augmentation might use.

    Python's ``random`` reseeds itself in a forked child; NumPy's and torch's global streams do not,
    so processes forked from one parent, and never reseeded, draw the same numbers from those two.
    """
    draws = {"random": [random.random() for _ in range(n)], "numpy": [float(x) for x in np.random.rand(n)]}
    try:
        import torch
    except ImportError:
        return os.getpid(), draws
    draws["torch"] = [float(x) for x in torch.rand(n)]
    return os.getpid(), draws
