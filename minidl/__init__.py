"""minidl: a small, readable reimplementation of ``torch.utils.data``.

Import it where you would import ``torch.utils.data``; it needs only NumPy. torch, when
installed, is imported lazily where tensors are made or moved, and then every batch matches
torch's own loader for the same seed.
"""

from minidl.collate import default_collate, default_collate_fn_map, default_convert, numpy_collate
from minidl.dataloader import DataLoader
from minidl.dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from minidl.distributed import DistributedSampler
from minidl.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from minidl.worker import WorkerInfo, get_worker_info

__version__ = "0.1.0"


__all__ = [
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "WorkerInfo",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "get_worker_info",
    "numpy_collate",
    "random_split",
]
