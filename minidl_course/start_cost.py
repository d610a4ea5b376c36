"""A training script's worker start, timed: ``python start_cost.py METHOD WORKERS EPOCHS`` (notebook 09).

Like a training script, it imports torch at the top, then runs ``EPOCHS`` short epochs of torch's own
``DataLoader`` with ``WORKERS`` workers started by ``METHOD`` (fork, forkserver or spawn) and without
``persistent_workers``, so every epoch starts its workers again. It prints one JSON line: each epoch's wait for
its first batch and its whole length. A process that runs this file's top level adds a line (its pid and how
long ``import torch`` took in it) to the file named by ``MINIDL_START_LOG``: this process, and any worker that
re-runs the script (every spawned one; a forkserver worker unless the server already ran it, which depends on
the Python version). ``ch09.start_costs`` runs it once per method and reads both.
"""

import json
import os
import sys
import time

_t0 = time.perf_counter()
import torch  # noqa: E402 -- timed: what a worker that re-runs this script pays again
import torch.utils.data  # noqa: E402

if os.environ.get("MINIDL_START_LOG"):
    with open(os.environ["MINIDL_START_LOG"], "a") as log:
        log.write(f"{os.getpid()} {time.perf_counter() - _t0:.4f}\n")


class Numbers(torch.utils.data.Dataset):
    """Sample ``i`` is the tensor ``i``: next to no work, so the first batch's wait is the workers' start."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def main(method: str, workers: int, epochs: int) -> None:
    loader = torch.utils.data.DataLoader(Numbers(4 * workers), batch_size=2, num_workers=workers,
                                         multiprocessing_context=method)
    first, whole = [], []
    for _ in range(epochs):
        start = time.perf_counter()
        batches = iter(loader)  # starts the workers: no persistent_workers
        next(batches)
        first.append(time.perf_counter() - start)
        for _ in batches:
            pass
        whole.append(time.perf_counter() - start)
        del batches  # the workers stop here, as they do at the end of every epoch
    print(json.dumps({"method": method, "workers": workers, "pid": os.getpid(), "first_batch_s": first,
                      "epoch_s": whole}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
