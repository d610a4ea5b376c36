"""Right answers to exercise ch06_seeding other than the reference's, in a small module of their own: a spawned
worker imports the module its worker_init_fn lives in, and this one costs no more to import than a learner's."""

import random

import numpy as np
import torch.utils.data


def seeds_from_torch_initial_seed(worker_id):  # PyTorch's documented recipe
    torch.utils.data.get_worker_info().dataset.rng = np.random.default_rng(torch.initial_seed())


def seeds_from_the_reseeded_numpy(worker_id):  # a worker's np.random is already seeded per worker and epoch
    torch.utils.data.get_worker_info().dataset.rng = np.random.default_rng(np.random.randint(2**31))


def seeds_from_the_reseeded_random(worker_id):
    torch.utils.data.get_worker_info().dataset.rng = np.random.default_rng(random.getrandbits(64))
