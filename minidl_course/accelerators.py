"""What this machine has to copy batches to (CUDA, Apple's MPS, or the CPU alone), for notebooks 07 and 08.

Both chapters run everywhere and say what ran from what torch finds, instead of assuming a machine. Nothing here
allocates on a device. On MPS, torch 2.13 (and minidl) turn ``pin_memory=True`` off, and no cell of 07 calls torch's
pinning functions there (``pinning_skipped_here``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

ACCELERATORS = ("cuda", "mps", "cpu")

# what pin_memory=True does on each kind of machine, in torch 2.13 and minidl alike
_PINNING = {
    "cuda": "this machine has CUDA: pin_memory=True copies every batch into page-locked memory, no warning",
    "mps": "this machine has Apple's MPS: torch 2.13 does not pin there, so pin_memory=True warns as each pass "
           "starts (Python shows it the first time) and yields ordinary batches",
    "cpu": "this machine has no accelerator: pin_memory=True warns as each pass starts (Python shows it the first "
           "time) and yields ordinary batches",
}
_PINNING_SKIPPED = ("Apple's MPS: not tried here. On a Mac, torch's pinning calls have raised or handed back a tensor "
                    "on the MPS device instead of the CPU, depending on the version (pytorch#86060, #181374); "
                    "the DataLoader turns pin_memory off there, and so does minidl.")
_STREAMS = {
    "cuda": "this machine has CUDA: PrefetchLoader(device='cuda') copies on a side stream, as timm's does",
    "mps": "this machine has Apple's MPS, not CUDA: PrefetchLoader(device='cuda') falls back to the CPU, "
           "no streams (the timelines below are drawn, not measured); PrefetchLoader(device='mps') copies "
           "to the GPU one batch ahead, on its one queue (section 8)",
    "cpu": "this machine has no accelerator: PrefetchLoader(device='cuda') falls back to the CPU, no streams "
           "(the timelines below are drawn, not measured)",
}


def accelerator() -> str:
    """``"cuda"``, ``"mps"`` or ``"cpu"``: the accelerator torch would pin for and copy to here (``"cpu"``: none)."""
    import torch

    if not torch.accelerator.is_available():
        return "cpu"
    kind = torch.accelerator.current_accelerator().type
    return kind if kind in ACCELERATORS else "cpu"


def pinning_here() -> str:
    """One sentence for notebook 07: what ``pin_memory=True`` does on this machine."""
    return _PINNING[accelerator()]


def pinning_skipped_here() -> str | None:
    """Why 07 does not call torch's pinning functions here (Apple's MPS), or None where it does."""
    return _PINNING_SKIPPED if accelerator() == "mps" else None


def streams_here() -> str:
    """One sentence for notebook 08: what ``PrefetchLoader(device="cuda")`` does on this machine."""
    return _STREAMS[accelerator()]


@dataclass
class PinComparison:
    """minidl and torch run with ``pin_memory=True`` on the same data: what each warned, what it yielded."""

    setting: str  # "num_workers=0", ...
    batches: int
    our_warnings: list[str] = field(default_factory=list)
    their_warnings: list[str] = field(default_factory=list)
    same_batches: bool = True
    pinned: bool = False  # any batch of ours page-locked (True only where CUDA pins)

    def parity(self) -> str:
        """What holds on every machine: the same warnings and batches as torch."""
        return (f"{self.setting}: {self.batches} batches, the same warnings as torch: "
                f"{self.our_warnings == self.their_warnings}, the same batches: {self.same_batches}")

    def here(self) -> str:
        """What this machine gave: the warning's text, or none, and whether batches came back pinned."""
        said = "; ".join(sorted(set(self.our_warnings))) or "no warning"
        return f"{self.setting}: {said} (batches pinned: {self.pinned})"


def compare_pinning(data: Any, batch_size: int = 4, worker_counts: tuple[int, ...] = (0, 2)) -> list[PinComparison]:
    """Iterate minidl's and torch's ``DataLoader(TensorDataset(data), pin_memory=True)`` once per worker count."""
    import warnings

    import torch
    import torch.utils.data as tud

    import minidl

    def run(loader):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = [batch[0] for batch in loader]
        return batches, [str(w.message) for w in caught if "pin_memory" in str(w.message)]

    rows = []
    for workers in worker_counts:
        ours, our_warnings = run(minidl.DataLoader(minidl.TensorDataset(data), batch_size=batch_size,
                                                   pin_memory=True, num_workers=workers))
        theirs, their_warnings = run(tud.DataLoader(tud.TensorDataset(data), batch_size=batch_size,
                                                    pin_memory=True, num_workers=workers))
        same = len(ours) == len(theirs) and all(torch.equal(a, b) for a, b in zip(ours, theirs))
        rows.append(PinComparison(f"num_workers={workers}", len(ours), our_warnings, their_warnings, same,
                                  any(b.is_pinned() for b in ours)))
    return rows


@contextlib.contextmanager
def pretend_cuda() -> Iterator[None]:
    """For the ``with`` block, minidl's loaders in this process believe torch found CUDA, so ``pin_memory=True``
    starts the pin thread on any machine (07 pins stand-in batches with it; nothing touches a device)."""
    from unittest import mock

    import torch

    import minidl.dataloader

    cuda = torch.device("cuda")
    with mock.patch.object(minidl.dataloader, "_accelerator_available", lambda: True), \
            mock.patch.object(torch.accelerator, "current_accelerator", lambda check_available=False: cuda), \
            mock.patch.object(torch.accelerator, "current_device_index", lambda: 0), \
            mock.patch.object(torch.accelerator, "set_device_index", lambda index: None):  # the pin thread's device
        yield
