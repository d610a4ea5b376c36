"""A worker calls os._exit mid-epoch: how often does the consumer get a RuntimeError naming its pid?

Runs the scenario ``--runs`` times (default 50) with minidl's DataLoader and with torch's, and
prints how each run ended. A run counts as named when the error is a RuntimeError that names the
dead worker's pid (minidl also says how it ended: "exit code 3"). The rest is what escaped
instead (EOFError, ConnectionResetError: the dead worker's last batch handle couldn't be opened).

    python scripts/fault_loop.py [--runs 50] [--loader minidl|torch|both]
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import platform
import re
import sys
import time

import minidl
from minidl_course import toy


class ExitInWorker(toy.RangeDataset):
    """Calls os._exit(3) when fetching sample 9 in any worker, minidl's or torch's (not the main process)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.main_pid = os.getpid()

    def __getitem__(self, index: int) -> int:
        if index == 9 and os.getpid() != self.main_pid:
            os._exit(3)
        return super().__getitem__(index)


def one_run(module) -> str:
    """How one epoch over a dataset whose worker dies at sample 9 ended, in a few words."""
    loader = module.DataLoader(ExitInWorker(40), batch_size=2, num_workers=2)
    it = iter(loader)
    try:
        for _ in it:
            pass
        return "no error (a short epoch)"
    except Exception as e:  # noqa: BLE001 -- which exception escaped is the measurement
        pids = {str(w.pid) for w in it._workers}
        if isinstance(e, RuntimeError) and any(re.search(rf"\b{pid}\b", str(e)) for pid in pids):
            return "RuntimeError naming the pid" + (" and exit code 3" if "exit code 3" in str(e) else "")
        return f"{type(e).__name__}: {str(e)[:60]}"
    finally:
        del it, loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--loader", choices=["minidl", "torch", "both"], default="both")
    args = parser.parse_args()
    loaders = {"minidl": minidl}
    if args.loader in ("torch", "both"):
        import torch.utils.data

        loaders["torch"] = torch.utils.data
    if args.loader == "torch":
        del loaders["minidl"]
    print(f"{platform.node()}: Python {platform.python_version()}, start method "
          f"{multiprocessing.get_start_method()}, {args.runs} runs each")
    for name, module in loaders.items():
        start = time.perf_counter()
        outcomes = collections.Counter(one_run(module) for _ in range(args.runs))
        named = sum(n for outcome, n in outcomes.items() if outcome.startswith("RuntimeError naming the pid"))
        print(f"{name}: {named}/{args.runs} runs gave a RuntimeError naming the dead worker's pid "
              f"({time.perf_counter() - start:.1f} s)")
        for outcome, n in outcomes.most_common():
            print(f"  {n:3d}  {outcome}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
