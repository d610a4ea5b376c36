"""``python -m minidl_bench``: the command line; see ``minidl_bench`` for usage and adding suites."""

from minidl_bench.harness import main

# The guard matters: under the spawn start method each Pool worker imports this module again.
if __name__ == "__main__":
    raise SystemExit(main())
