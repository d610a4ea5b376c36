"""minidl_course.train: the course's CPU training step learns, and is reproducible from its seed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from minidl_course.train import Trainer  # noqa: E402


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (16, 8, 8, 3), dtype=torch.uint8, generator=g)  # N x H x W x C, as stored
    labels = (images.float().mean(dim=(1, 2, 3)) > 127.5).long()  # a learnable rule
    return images, labels


def test_same_seed_same_losses():
    a, b = Trainer(classes=2, seed=3), Trainer(classes=2, seed=3)
    assert [a.step(_batch(i)) for i in range(3)] == [b.step(_batch(i)) for i in range(3)]


def test_loss_falls_on_a_repeated_batch():
    trainer = Trainer(classes=2, lr=0.5, seed=0)
    batch = _batch()
    losses = [trainer.step(batch) for _ in range(30)]
    assert losses[-1] < losses[0]


def test_does_not_touch_the_global_stream():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    Trainer(seed=5)
    assert torch.equal(torch.rand(3), expected)
