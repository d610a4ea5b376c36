"""The backbone: over randomized loader settings, a run checkpointed and resumed (once or twice, with caught
errors, failing resumes) gives the uninterrupted run's batches."""

from __future__ import annotations

import multiprocessing
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from resumetools import SWEEP_EXAMPLES, _same_epochs, _sweep_run, sweep_configs

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


@settings(max_examples=SWEEP_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(config=sweep_configs())
def test_resumed_equals_uninterrupted_over_random_settings(config):
    gate = multiprocessing.get_context().Event() if config["fail_resume"] else None
    full = _sweep_run(config, [], gate)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Length of IterableDataset")
        resumed = _sweep_run(config, config["cuts"], gate)
    _same_epochs(resumed, full, config)
