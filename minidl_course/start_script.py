"""A training script's first lines, as most look: torch imported at the top, then a DataLoader with workers.

    python start_script.py METHOD WORKERS EPOCHS [PERSISTENT]

starts ``WORKERS`` workers with the start method ``METHOD`` (fork, forkserver or spawn) for a tiny dataset,
``EPOCHS`` times without ``persistent_workers`` and then (unless ``PERSISTENT`` is ``off``) with it, and
prints one JSON line: this CPython's version and, for each setting, the wait for each epoch's first batch
(what starting the workers costs, since the batches are next to free). Notebooks 01 and 05 run it through
``minidl_course.startup.start_method_costs``, as a separate process, because a worker started by spawn or
forkserver runs the top of the *script* that started it: a notebook's kernel is no script. Each run of this
file's top in another process (a spawn worker, a forkserver worker, or the forkserver itself when it preloads
``__main__``) appends its pid to the file named by ``MINIDL_TOP_RUNS``, if set: that count tells whether the
import of torch was paid once or per worker.
"""

import json
import os
import sys
import time

import torch
import torch.utils.data as tud

if __name__ != "__main__" and os.environ.get("MINIDL_TOP_RUNS"):  # this file's top, run again in another process
    with open(os.environ["MINIDL_TOP_RUNS"], "a") as runs:
        runs.write(f"{os.getpid()}\n")


def first_batch_waits(method: str, workers: int, epochs: int, persistent: bool) -> list[float]:
    """Seconds from ``iter(loader)`` to the first batch, for each of ``epochs`` epochs of one loader."""
    dataset = tud.TensorDataset(torch.arange(64))
    loader = tud.DataLoader(dataset, batch_size=8, num_workers=workers, multiprocessing_context=method,
                            persistent_workers=persistent)
    waits = []
    for _ in range(epochs):
        start = time.perf_counter()
        batches = iter(loader)
        next(batches)
        waits.append(time.perf_counter() - start)
        for _ in batches:
            pass
    return waits


def main() -> None:
    method, workers, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    settings = (False,) if sys.argv[4:] == ["off"] else (False, True)
    result = {"python": sys.version.split()[0], "method": method, "workers": workers}
    for persistent in settings:
        result[f"persistent={persistent}"] = first_batch_waits(method, workers, epochs, persistent)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
