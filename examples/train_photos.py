"""Train a small CNN on the course's photographs; print each epoch's time and its share spent waiting for data.

    python examples/train_photos.py --num-workers 2 --persistent-workers

Each lever is a DataLoader argument under torch's name; --thread-workers and --trace are minidl's only.
"""
import argparse
import random
import time
from pathlib import Path

import torch
import torch.utils.data
from PIL import Image
from torch import nn

from minidl_course.photos import photo_folder, train_transform

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1) * 255  # ImageNet's, on 0-255 pixels
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1) * 255


class Photos(torch.utils.data.Dataset):
    def __init__(self, root, size, limit=None):  # <class>/<n>.jpg files, a file of each class in turn
        self.files = sorted(Path(root).glob("*/*.jpg"), key=lambda f: (f.name, f.parent.name))[:limit]
        self.labels = [sorted({f.parent.name for f in self.files}).index(f.parent.name) for f in self.files]
        self.augment = train_transform(size)  # timm's random resized crop and flip, to uint8 (3, size, size)

    def __len__(self):
        return len(self.files)

    def image(self, i):
        with Image.open(self.files[i]) as image:
            return torch.from_numpy(self.augment(image.convert("RGB")))  # Pillow decodes the JPEG in convert()

    def __getitem__(self, i):
        return (self.image(i) - MEAN) / STD, self.labels[i]


class BatchedPhotos(Photos):
    def __getitems__(self, indices):  # the batch made at once, normalised in one go; collate_fn passes it on
        images = torch.stack([self.image(i) for i in indices])
        return (images - MEAN) / STD, torch.tensor([self.labels[i] for i in indices])


def as_is(batch):
    return batch


def make_loader(args):
    photos = (BatchedPhotos if args.batched_fetch else Photos)(photo_folder(), args.size, args.limit)
    options = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers, pin_memory=args.pin_memory,
                   collate_fn=as_is if args.batched_fetch else None)
    if args.num_workers > 0:
        options.update(persistent_workers=args.persistent_workers, prefetch_factor=args.prefetch_factor,
                       multiprocessing_context=args.start_method)
    if not (args.thread_workers or args.trace):
        return torch.utils.data.DataLoader(photos, **options)
    import minidl  # minidl only: thread workers, a trace of every batch
    method = "thread" if args.thread_workers else "multiprocessing"
    return minidl.DataLoader(photos, **options, worker_method=method, trace=bool(args.trace))


def train(args):
    torch.manual_seed(0)  # the weights, the shuffle, and each worker's seeds
    random.seed(0)  # the augmentation without workers
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    loader = make_loader(args)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(),
                          nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(64, max(loader.dataset.labels) + 1)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    print(f"{len(loader.dataset)} photos, {len(loader)} batches an epoch, on {args.device}, "
          f"torch.get_num_threads() = {torch.get_num_threads()}", flush=True)
    for epoch in range(1, args.epochs + 1):
        start = ready = time.perf_counter()
        waiting = 0.0
        for images, labels in loader:
            waiting += time.perf_counter() - ready  # since the last step ended, or the epoch began
            images, labels = (t.to(args.device, non_blocking=args.pin_memory) for t in (images, labels))
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ready = time.perf_counter()
        took = time.perf_counter() - start
        waiting += start + took - ready  # the end of the epoch, when the loader shuts its workers down
        print(f"epoch {epoch}: {took:.3f} s, waiting for data {waiting / took:.1%}, loss {loss.item():.3f}", flush=True)
    if args.trace:
        torch.save(loader.trace, args.trace)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--num-workers", 0), ("--batch-size", 32), ("--prefetch-factor", None),
                          ("--torch-threads", None), ("--epochs", 3), ("--size", 128), ("--limit", None)):
        p.add_argument(flag, type=int, default=default)
    for flag in ("--batched-fetch", "--persistent-workers", "--thread-workers", "--pin-memory"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--start-method", choices=("fork", "forkserver", "spawn"))  # multiprocessing_context
    p.add_argument("--trace", help="save minidl's trace of the loader to this file")
    available = torch.accelerator.is_available()
    p.add_argument("--device", default=str(torch.accelerator.current_accelerator()) if available else "cpu")
    return p.parse_args(argv)


if __name__ == "__main__":  # spawn and forkserver workers import this file: nothing may run on import but this
    train(parse())
