"""Reference answer to ch05_keep_up."""

from __future__ import annotations

from minidl.dataloader import DataLoader
from minidl.sampler import BatchSampler, SequentialSampler


def make_loader(records) -> DataLoader:
    """Both levers: each batch read in one request (a BatchSampler as the sampler, batch_size=None), by a worker
    that reads the next batch while the step runs."""
    batches = BatchSampler(SequentialSampler(records), batch_size=16, drop_last=False)
    return DataLoader(records, sampler=batches, batch_size=None, num_workers=1)
