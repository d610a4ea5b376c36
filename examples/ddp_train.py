"""Data-parallel training on the CPU: each rank loads its own shard through minidl.

Launch two ranks on this machine (gloo backend, loopback):

    torchrun --nproc_per_node=2 examples/ddp_train.py --out /tmp/ddp

Each rank builds the same synthetic regression dataset, takes its shard with
``DistributedSampler`` (which asks torch.distributed for the world size and its rank), loads it
with ``DataLoader(num_workers=...)``, calls ``set_epoch`` so every epoch reshuffles, and averages
gradients across ranks with ``all_reduce`` before each SGD step. Every rank ends with the same
model. ``--loader torch`` runs the same script on ``torch.utils.data`` for comparison. Each rank
writes what it saw (indices per epoch, loss per step) to ``OUT/rank{R}.json``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist


def make_dataset(module, n: int = 103, features: int = 4):
    """A fixed regression problem, identical on every rank: y = x @ w + noise, plus the index."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=g)
    w = torch.arange(1.0, features + 1)
    y = x @ w + 0.1 * torch.randn(n, generator=g)
    return module.TensorDataset(x, y, torch.arange(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loader", choices=["minidl", "torch"], default="minidl")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--out", default=None, help="folder for rank{R}.json")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.loader == "minidl":
        import minidl as data
    else:
        import torch.utils.data as data

    dataset = make_dataset(data)
    sampler = data.DistributedSampler(dataset, shuffle=True, seed=7)  # rank and world from the group
    loader = data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers)

    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Linear(dataset.tensors[0].shape[1], 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen, losses = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # without this, every epoch would repeat the same order
        seen.append([])
        for x, y, idx in loader:
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():  # average gradients over ranks: what DDP does for you
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= world
            opt.step()
            seen[-1].extend(idx.tolist())
            losses.append(loss.item())
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world": world, "seen": seen, "losses": losses,
                       "weight": model.weight.detach().flatten().tolist()}, f)
    if rank == 0:
        print(f"{args.loader}: {world} ranks, final loss {losses[-1]:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
