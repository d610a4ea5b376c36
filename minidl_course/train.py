"""A small training step on the CPU: the consumer the course's loaders feed from notebook 05 on.

A sleep pretends to be a model; this is one. ``Trainer.step(batch)`` runs a forward pass, a loss, a
backward pass and an SGD update of a two-layer conv net, so "is the loader the bottleneck?" is asked of
a real loop. Needs torch.
"""

from __future__ import annotations

from typing import Any


def _tiny_net(channels: int, classes: int):
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(channels, 16, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, classes),
    )


class Trainer:
    """A tiny conv net and its optimizer; ``step(batch)`` trains on one ``(images, labels)`` batch.

    Images are ``N x C x H x W`` (float, or uint8 scaled to [0, 1] here); labels are class indices.
    ``seed`` fixes the initial weights, so two runs on the same batches give the same losses.

    >>> import torch
    >>> trainer = Trainer(channels=3, classes=4, seed=0)
    >>> loss = trainer.step((torch.zeros(2, 3, 8, 8), torch.tensor([0, 1])))
    >>> isinstance(loss, float), trainer.steps
    (True, 1)
    """

    def __init__(self, channels: int = 3, classes: int = 10, lr: float = 0.05, seed: int = 0) -> None:
        import torch

        with torch.random.fork_rng(devices=[]):  # seed the weights without touching the caller's stream
            torch.manual_seed(seed)
            self.model = _tiny_net(channels, classes)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.steps = 0

    def step(self, batch: Any) -> float:
        """One optimisation step on ``batch``; returns the loss before the update."""
        import torch

        images, labels = batch[0], batch[1]
        images = torch.as_tensor(images)
        if images.dtype == torch.uint8:
            images = images.float() / 255
        if images.ndim == 4 and images.shape[-1] in (1, 3) and images.shape[1] not in (1, 3):
            images = images.permute(0, 3, 1, 2)  # N x H x W x C (as images are stored) -> N x C x H x W
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(images.float()), torch.as_tensor(labels).long())
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return loss.item()
