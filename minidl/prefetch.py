"""PrefetchLoader: copy the next batch to the GPU on a side CUDA stream while the model works on this one.

Mirrors timm's ``timm/data/loader.py`` (``PrefetchLoader`` and ``fast_collate``). Batches cross to
the device as uint8, a quarter of float32's bytes, and become normalised floats there. Without CUDA
the same steps run on the CPU, minus the streams. Unlike the core, this module imports torch at the
top. ``import minidl`` does not import this module, so only code that asks for a prefetcher pays for torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)  # per channel, for images scaled to [0, 1]
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)

Batch = tuple[torch.Tensor, torch.Tensor]  # (images (N, C, H, W), targets (N,))


def fast_collate(batch: Sequence[tuple[Any, int]], *, channels_last: bool = False) -> Batch:
    """Stack ``(image, target)`` samples into a uint8 ``(N, C, H, W)`` batch and int64 targets, never going to float.

    Images are uint8 NumPy arrays or tensors, ``(C, H, W)`` or ``(H, W)``. With ``channels_last=True``
    they are ``(H, W, C)``, as ``np.asarray(pil_image)`` gives them. Use it as a DataLoader's
    ``collate_fn`` (``functools.partial(fast_collate, channels_last=True)`` for the second kind).
    ``channels_last`` is a minidl addition. timm's tuple-of-images samples are not supported.

    >>> images, targets = fast_collate([(np.full((2, 2, 3), i, np.uint8), i) for i in range(4)], channels_last=True)
    >>> images.shape, images.dtype, targets.tolist()
    (torch.Size([4, 3, 2, 2]), torch.uint8, [0, 1, 2, 3])
    """
    images = [_as_chw(image, channels_last) for image, _ in batch]  # views: nothing copied yet
    targets = torch.tensor([target for _, target in batch], dtype=torch.int64)
    if isinstance(images[0], np.ndarray):
        # One copy, into a C-ordered (N, C, H, W) array (np.stack alone would keep an HWC sample's layout).
        out = np.empty((len(images), *images[0].shape), dtype=np.uint8)
        return torch.from_numpy(np.stack(images, out=out)), targets
    return torch.stack(images), targets


def _as_chw(image: np.ndarray | torch.Tensor, channels_last: bool) -> np.ndarray | torch.Tensor:
    is_numpy = isinstance(image, np.ndarray)
    if image.dtype != (np.uint8 if is_numpy else torch.uint8):
        raise TypeError(f"fast_collate expects uint8 images, got {image.dtype}: normalisation belongs on the device")
    if image.ndim == 2:  # grayscale (H, W): one channel
        return image[None]
    if channels_last:
        return image.transpose(2, 0, 1) if is_numpy else image.permute(2, 0, 1)
    return image


class PrefetchLoader:
    """Wrap a loader of uint8 ``(images, targets)`` batches, and yield them on ``device``, normalised, one ahead.

    Each image becomes ``(x - mean * 255) / (std * 255)`` in ``img_dtype``, float32 by default
    (``fp16=True`` means float16). It then goes through ``random_erasing``, a callable on the
    normalised device batch, if one is given. The parameters come in timm's order. minidl differs from timm
    in four ways. ``random_erasing`` takes any callable instead of timm's ``re_prob``/``re_mode``/``re_count``/
    ``re_num_splits``. A ``mean`` or ``std`` of the wrong length raises ``ValueError``, where timm averages
    it with a warning. ``device="cuda"`` without CUDA falls back to the CPU. There is no ``mixup_enabled``,
    timm's switch for its ``FastCollateMixup``, which minidl does not have.
    """

    def __init__(self, loader: Iterable[Batch], mean: float | Sequence[float] = IMAGENET_DEFAULT_MEAN,
                 std: float | Sequence[float] = IMAGENET_DEFAULT_STD, channels: int = 3,
                 device: str | torch.device = "cuda", img_dtype: torch.dtype | None = None, fp16: bool = False,
                 random_erasing: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        device = torch.device(device)
        self.is_cuda = device.type == "cuda" and torch.cuda.is_available()
        if device.type == "cuda" and not self.is_cuda:
            device = torch.device("cpu")  # with no GPU here, the same steps run on the CPU
        self.loader = loader
        self.device = device
        self.dtype = torch.float16 if fp16 else img_dtype or torch.float32  # fp16 wins, as in timm
        self.random_erasing = random_erasing
        shape = (1, channels, 1, 1)  # broadcasts over (N, C, H, W)
        # The statistics are for images in [0, 1]. Scaled by 255, they normalise raw uint8 values directly.
        self.mean = torch.tensor([m * 255 for m in _per_channel(mean, channels)], device=device, dtype=self.dtype)
        self.std = torch.tensor([s * 255 for s in _per_channel(std, channels)], device=device, dtype=self.dtype)
        self.mean, self.std = self.mean.view(shape), self.std.view(shape)

    # NOTE [ Prefetching on a side stream ]
    #
    #   loader (host, pinned uint8)   side stream                       consumer's stream
    #   ---------------------------   -----------                       -----------------
    #   batch i+1 ------------------> copy, to float, normalise         step(batch i)  <- yielded meanwhile
    #                                             \__ wait_stream ____> step(batch i+1)
    #
    # Each turn of the loop in __iter__:
    #   1. Queue batch i+1's copy and its normalisation on the side stream. The copy is non_blocking,
    #      so the host does not wait for it.
    #   2. Yield batch i, queued one turn earlier. The consumer's step on it overlaps step 1 on the GPU.
    #   3. When the consumer asks for more, make its stream wait for the side stream, so that it never
    #      reads batch i+1 half-written. Then record_stream batch i+1 on it (see the comment there).
    # Without CUDA there are no streams. The same code runs eagerly, one batch ahead all the same.

    def __iter__(self) -> Iterator[Batch]:
        stream = torch.cuda.Stream(device=self.device) if self.is_cuda else None
        images = targets = None  # the batch in flight: handed out on the next turn
        for next_images, next_targets in self.loader:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                # Copy uint8, then convert: converting first would send four times the bytes.
                next_images = next_images.to(self.device, non_blocking=True)
                next_targets = next_targets.to(self.device, non_blocking=True)
                # copy=True: on the CPU, .to() may hand back the loader's own tensor, and sub_ would overwrite it.
                next_images = next_images.to(self.dtype, copy=True).sub_(self.mean).div_(self.std)
                if self.random_erasing is not None:
                    next_images = self.random_erasing(next_images)
            if images is not None:
                yield images, targets
            if stream is not None:
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_stream(stream)
                # The caching allocator files this memory under the side stream that allocated it, and
                # would reuse it for a later batch as soon as Python drops the tensor, even while kernels
                # queued on the consumer's stream still read it. record_stream makes it wait for those.
                next_images.record_stream(consumer)
                next_targets.record_stream(consumer)
            images, targets = next_images, next_targets
        if images is not None:
            yield images, targets

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def sampler(self):
        return self.loader.sampler

    @property
    def dataset(self):
        return self.loader.dataset


def _per_channel(values: float | Sequence[float], channels: int) -> tuple[float, ...]:
    """One statistic per channel. A single number is repeated, and a sequence must have one per channel."""
    if isinstance(values, int | float):
        return (float(values),) * channels
    if len(values) != channels:
        raise ValueError(f"expected {channels} per-channel values, got {len(values)}: {tuple(values)}")
    return tuple(values)
