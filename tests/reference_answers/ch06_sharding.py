"""Reference answer to ch06_sharding (a module, so workers under any start method can import it)."""

from __future__ import annotations

import torch.utils.data


def shard_worker_init_fn(worker_id: int) -> None:
    """Give this worker the ``worker_id``-th contiguous part of its dataset's ``[start, end)``."""
    info = torch.utils.data.get_worker_info()  # minidl's workers set torch's too
    dataset = info.dataset  # this worker's own copy
    start, end = dataset.start, dataset.end
    per_worker = -(-(end - start) // info.num_workers)  # rounded up: the last part may be shorter, or empty
    dataset.start = min(start + worker_id * per_worker, end)
    dataset.end = min(dataset.start + per_worker, end)
