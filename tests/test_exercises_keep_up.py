"""The exercise checker ch05_keep_up (make a loader keep up with the training step): it passes the reference answer
and the other right answers (workers alone, a batch per request alone, torch's loader, thread workers), and refuses
each family of wrong answer with the hint that names the mistake. The checker runs every loader itself, so these
tests run real epochs (about a second each, plus the workers' start)."""

import importlib
import re

import pytest
import torch
from exercise_support import learner_copy, no_children_left, rejects_with_hint

import minidl
from minidl.sampler import BatchSampler, SequentialSampler
from minidl_course.exercises import ReferenceAnswer
from minidl_course.exercises import ch05_keep_up as ch05
from minidl_course.exercises._common import _Checks

pytestmark = pytest.mark.timeout(240)

make_loader = learner_copy("ch05_keep_up").make_loader


def per_batch(records):
    return BatchSampler(SequentialSampler(records), batch_size=16, drop_last=False)


# --- right answers --------------------------------------------------------------------------------------------


@pytest.mark.measures
def test_the_reference_answer_passes_and_the_check_says_what_it_measured(capsys):
    ch05.check_keep_up(make_loader)
    out = capsys.readouterr().out
    assert "Measured on my clock, 1 worker, a batch per request: the step waited" in out
    assert out.endswith("All 3 checks passed\n")
    share = float(re.search(r"the step waited (\d+)% of the time", out).group(1)) / 100
    assert share <= ch05.MAX_WAIT and "over the 23 batches after the first 1" in out
    assert not no_children_left()


@pytest.mark.parametrize("right", [
    lambda r: minidl.DataLoader(r, batch_size=16, num_workers=2),  # workers alone
    lambda r: minidl.DataLoader(r, sampler=per_batch(r), batch_size=None),  # a batch per request alone
    lambda r: torch.utils.data.DataLoader(r, batch_size=16, num_workers=3, persistent_workers=True),
    lambda r: minidl.DataLoader(r, batch_size=16, num_workers=2, worker_method="thread"),  # the step frees the CPU
], ids=["two-workers", "batched-no-workers", "torch-three-workers", "minidl-thread-workers"])
def test_every_right_answer_passes(right, capsys):
    ch05.check_keep_up(right)
    assert capsys.readouterr().out.endswith("All 3 checks passed\n")
    assert not no_children_left()


def test_an_imported_reference_answer_is_refused_in_one_line():
    reference = importlib.import_module("reference_answers.ch05_keep_up").make_loader
    with pytest.raises(ReferenceAnswer, match="make_loader is the reference answer"):
        ch05.check_keep_up(reference)


def test_the_given_loader_falls_behind_and_a_batch_per_request_reads_faster():
    slow = ch05.wait_share(ch05.given_loader)
    assert slow.wait_share > ch05.MAX_WAIT and slow.workers == 0 and not slow.batched
    batched = ch05.wait_share(lambda r: minidl.DataLoader(r, sampler=per_batch(r), batch_size=None))
    assert batched.batched and batched.wait_share < slow.wait_share
    records = ch05.Records(n=40, seed=1)
    one_by_one = torch.utils.data.default_collate([records[i] for i in range(16)])
    at_once = torch.utils.data.default_convert(records[list(range(16))])
    assert all(torch.equal(a, b) for a, b in zip(one_by_one, at_once, strict=True))
    assert records.reads == 17


# --- wrong answers, each with its hint ------------------------------------------------------------------------


def too_few_workers(r):
    return minidl.DataLoader(r, batch_size=16, num_workers=1)


def reads_ahead(r):
    return list(minidl.DataLoader(r, batch_size=16))


def warms_up(r):
    r[0]
    return minidl.DataLoader(r, batch_size=16, num_workers=2)


def shuffled(r):
    return minidl.DataLoader(r, batch_size=16, num_workers=2, shuffle=True)


def out_of_order(r):  # batches 0 and 1 swapped (in_order=False would do the same, when a batch came late)
    return minidl.DataLoader(r, batch_size=16, num_workers=2,
                             sampler=[i for k in (1, 0) for i in range(16 * k, 16 * k + 16)] + list(range(32, len(r))))


def skips_half(r):
    return minidl.DataLoader(r, batch_size=16, num_workers=2, sampler=range(0, len(r), 2))


def smaller_batches(r):
    return minidl.DataLoader(r, batch_size=8, num_workers=2)


def batches_of_batches(r):
    return minidl.DataLoader(r, sampler=per_batch(r), num_workers=1)


def prefetch_without_workers(r):
    return torch.utils.data.DataLoader(r, batch_size=16, prefetch_factor=4)


def its_own_records(r):
    return minidl.DataLoader(ch05.Records(), batch_size=16, num_workers=2)


def two_epochs(r):
    return minidl.DataLoader(r, batch_size=16, num_workers=2,
                             sampler=minidl.sampler.RandomSampler(r, replacement=True, num_samples=2 * len(r)))


@pytest.mark.parametrize("wrong, hint", [
    (ch05.given_loader, r"waited for data \d+% of the time for a typical batch; at most 25%.*with no workers the "
                        r"main process reads each batch .*nothing overlaps"),
    (too_few_workers, r"1 worker, each reading a batch in about 50 ms, deliver one every ~50 ms; the step takes 30 ms"),
    (lambda r: 0.04, r"returned a float: 0\.04.*never takes a number from you"),
    (reads_ahead, r"returned a list.*a list of batches read before the loop starts"),
    (warms_up, r"made 1 reads before the loop began.*read nothing yet"),
    (shuffled, r"batch 0\[0\]\[.*should be .*those are records, but not the right ones: the batches come in order"),
    (out_of_order, r"batch 0\[0\]\[.*should be .*not the right ones: .*in_order left True"),
    (skips_half, r"the loader gave 12 batches; an epoch of 384 records in batches of 16 is 24.*skips some"),
    (smaller_batches, r"should have shape \(16, 3, 8, 8\), but it has shape \(8, 3, 8, 8\).*keep batches of 16"),
    (batches_of_batches, r"should have shape \(16, 3, 8, 8\), but it has shape \(1, 16, 3, 8, 8\).*batched your "
                         r"batches: .*batch_size=None"),
    (prefetch_without_workers, r"raised ValueError.*prefetch_factor.*with num_workers=0 there are none"),
    (its_own_records, r"not the records make_loader was given"),
    (two_epochs, r"gave more than 24 batches.*one epoch, every record once"),
], ids=["no-workers", "one-worker", "a-number", "read-ahead", "reads-in-make-loader", "shuffled", "reordered",
        "skips-samples", "smaller-batches", "batches-of-batches", "prefetch-without-workers", "other-records",
        "runs-on"])
def test_a_wrong_answer_is_refused_with_the_hint_that_names_it(wrong, hint):
    rejects_with_hint(ch05.check_keep_up, wrong, hint="(?s)" + hint)
    assert not no_children_left()


def run(waits, workers, batched):
    return ch05.Run(waits=waits, steps=[ch05.STEP_S] * len(waits), workers=workers, batched=batched)


def test_the_verdict_leaves_out_each_workers_first_batch_and_one_stall_and_names_the_lever_left():
    started_slowly = run([3.0, 2.5, 0.001, 0.002] + [0.001] * 20, workers=2, batched=False)
    assert started_slowly.skipped == 2 and started_slowly.wait_share < 0.1
    ch05.judge(started_slowly, _Checks())  # start-up is not the steady state: passes
    one_stall = run([0.1] + [0.001] * 10 + [0.5] + [0.001] * 12, workers=1, batched=True)  # a burst of other work
    assert one_stall.wait_share < 0.1
    ch05.judge(one_stall, _Checks())
    rejects_with_hint(ch05.judge, run([0.01] + [0.02] * 23, workers=0, batched=True), _Checks(),
                      hint=r"(?s)waited for data 40%.*with no workers it is still read while the step waits")
    rejects_with_hint(ch05.judge, run([0.5] + [0.02] * 23, workers=3, batched=True), _Checks(),
                      hint=r"(?s)too busy to keep up even so")


def test_a_batch_sampler_reads_a_record_per_request_and_a_batch_sampler_as_sampler_a_batch():
    """batch_sampler= hands the fetcher index lists it reads one record at a time; as sampler= (batch_size=None)
    each list is one request. Both loaders say batch_size is None: the verdict must tell them apart."""
    as_batch_sampler = ch05.wait_share(lambda r: minidl.DataLoader(r, batch_sampler=per_batch(r)))
    assert not as_batch_sampler.batched and "a record per request" in str(as_batch_sampler)
    as_sampler = ch05.wait_share(lambda r: torch.utils.data.DataLoader(r, sampler=per_batch(r), batch_size=None))
    assert as_sampler.batched
    rejects_with_hint(ch05.check_keep_up, lambda r: minidl.DataLoader(r, batch_sampler=per_batch(r)),
                      hint=r"(?s)no workers the main process reads each batch \(16 requests.*read each batch in one "
                           r"request")
