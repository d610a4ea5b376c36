"""What only the course needs: the notebooks' helpers and harnesses, toy datasets, and the exercise checkers.

It stands beside ``minidl`` and imports it; ``minidl`` never imports this package. Anything a worker runs
lives here, in a module at top level, because a class defined in a notebook cell cannot be pickled under
``spawn`` or ``forkserver``.

One home for each job: a helper that runs a benchmark suite or reads or draws its numbers lives in ``minidl_bench``,
which imports this package (never the other way round); everything else the notebooks and checkers run lives here,
the measuring harnesses the suites share included (``png_pipeline``, ``rounds``, ``photos``, ``cores``).
"""
