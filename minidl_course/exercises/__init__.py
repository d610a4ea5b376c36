"""Checkers for ``notebooks/exercises/``, one module per exercise: seeded cases, the first wrong one raised with what
was expected, what came back and a hint; expected values never from a reference answer, which is refused."""

from minidl_course.exercises._common import ReferenceAnswer, YourTurn, first_difference
from minidl_course.exercises.ch01_nogil import check_nogil
from minidl_course.exercises.ch02_sampler import check_sampler
from minidl_course.exercises.ch03_collate import check_collate, make_token_samples
from minidl_course.exercises.ch04_slow_sample import SlowSampleDataset, check_slow_sample, slow_loader
from minidl_course.exercises.ch05_reorder import Arrivals, check_reorder
from minidl_course.exercises.ch05_worker_loop import check_worker_loop, run_worker_processes
from minidl_course.exercises.ch06_seeding import AugmentedDataset, check_worker_seeding
from minidl_course.exercises.ch06_sharding import call_as_worker, check_worker_init_fn, range_stream
from minidl_course.exercises.ch07_pinning_cost import check_pin_copy
from minidl_course.exercises.ch08_prefetcher import RecordingLoader, check_prefetcher, make_image_batches
from minidl_course.exercises.ch09_threads_or_processes import check_choice
from minidl_course.exercises.ch10_overhead_ratio import check_overhead
from minidl_course.exercises.ch11_vectorise_or_workers import check_decision
from minidl_course.exercises.ch12_pitfalls_debug import check_no_hang, check_no_leak, check_num_workers

__all__ = ["Arrivals", "AugmentedDataset", "RecordingLoader", "ReferenceAnswer", "SlowSampleDataset", "YourTurn",
           "call_as_worker", "check_choice", "check_collate", "check_decision", "check_no_hang", "check_no_leak",
           "check_nogil", "check_num_workers", "check_overhead", "check_pin_copy", "check_prefetcher", "check_reorder",
           "check_sampler", "check_slow_sample", "check_worker_init_fn", "check_worker_loop", "check_worker_seeding",
           "first_difference", "make_image_batches", "make_token_samples", "range_stream", "run_worker_processes",
           "slow_loader"]
