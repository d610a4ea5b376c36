"""Torch reporting an accelerator this CPU-only build lacks, for torch and minidl alike (pytest's monkeypatch).

``report_mps`` makes ``torch.accelerator`` and ``torch.backends.mps`` answer as on an Apple-silicon Mac: torch 2.13
and minidl then turn ``pin_memory`` off, so nothing tries to pin or allocate on MPS. ``report_cuda`` answers as a
CUDA machine and, as this build cannot page-lock, makes ``Tensor.pin_memory`` return a plain copy (``is_pinned()``
stays False). Imported by name (``from accelerator_fakes import ...``): pytest puts this folder on ``sys.path``.
"""

from __future__ import annotations

import torch


def _report(monkeypatch, kind: str) -> None:
    device = torch.device(kind)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: device)
    monkeypatch.setattr(torch.get_device_module(kind), "is_available", lambda: True)


def report_mps(monkeypatch) -> None:
    """torch sees MPS as its current, available accelerator (the brief's ``torch.backends.mps.is_available``, and
    what ``torch.accelerator`` asks: its compiled-in accelerator and ``torch.mps.is_available``)."""
    _report(monkeypatch, "mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)


def report_cuda(monkeypatch) -> None:
    """torch sees one CUDA device; pinning a tensor returns a copy, as this build has no pinned allocator."""
    _report(monkeypatch, "cuda")
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, device=None: self.clone())
