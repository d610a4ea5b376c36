"""Reference answer to ch06_seeding (a module, so workers under any start method can import it)."""

from __future__ import annotations

import numpy as np
import torch.utils.data


def seed_worker(worker_id: int) -> None:
    """Give this worker's copy of the dataset a generator of its own, seeded from the worker's seed."""
    info = torch.utils.data.get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)  # info.seed differs per worker and per epoch
