"""A training script's first lines, as most look: torch imported at the top, then a DataLoader with workers.

    python train.py METHOD WORKERS EPOCHS [off]

``minidl_course.startup.start_method_costs`` copies this file to ``train.py`` in a folder of its own and runs
it there, once per start method, as a separate process: a worker started by spawn or forkserver runs the top
of the *script* that started it, and a notebook's kernel is no script. It starts ``WORKERS`` workers with
``METHOD`` (fork, forkserver or spawn) for a tiny dataset, ``EPOCHS`` times without ``persistent_workers`` and
then (unless ``off``) with it, and prints one JSON line: this CPython's version, its pid and, for each setting,
each epoch's wait for its first batch (what starting the workers costs: the batches are next to free) and its
whole length. Every process that runs this file's top (this one, a spawn or forkserver worker, or the fork
server when it preloads ``__main__``) adds its pid and how long ``import torch`` took in it to the file named by
``MINIDL_START_LOG``, if set: which processes paid for the import, and what it cost each.
"""

import json
import os
import sys
import time

_t0 = time.perf_counter()
import torch  # noqa: E402 -- timed: what a process that runs this script's top pays
import torch.utils.data as tud  # noqa: E402

if os.environ.get("MINIDL_START_LOG"):
    with open(os.environ["MINIDL_START_LOG"], "a") as log:
        log.write(f"{os.getpid()} {time.perf_counter() - _t0:.4f}\n")


def epochs_timed(method: str, workers: int, epochs: int, persistent: bool) -> dict[str, list[float]]:
    """For each of ``epochs`` epochs of one loader: seconds from ``iter(loader)`` to its first batch, and to its end."""
    dataset = tud.TensorDataset(torch.arange(16 * workers))
    loader = tud.DataLoader(dataset, batch_size=4, num_workers=workers, multiprocessing_context=method,
                            persistent_workers=persistent)
    first, whole = [], []
    for _ in range(epochs):
        start = time.perf_counter()
        batches = iter(loader)  # starts the workers, unless persistent ones are still there
        next(batches)
        first.append(time.perf_counter() - start)
        for _ in batches:
            pass
        whole.append(time.perf_counter() - start)
    return {"first_batch_s": first, "epoch_s": whole}


def main() -> None:
    method, workers, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    settings = (False,) if sys.argv[4:] == ["off"] else (False, True)
    result = {"python": sys.version.split()[0], "method": method, "workers": workers, "pid": os.getpid()}
    for persistent in settings:
        result[f"persistent={persistent}"] = epochs_timed(method, workers, epochs, persistent)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
