"""What only the course needs: the notebooks' helpers and harnesses, toy datasets, and the exercise checkers.

It stands beside ``minidl`` and imports it; ``minidl`` never imports this package. Anything a worker runs
lives here, in a module at top level, because a class defined in a notebook cell cannot be pickled under
``spawn`` or ``forkserver``.
"""
