"""What only the course needs: exercise checkers, toy datasets and demo helpers.

The loader (the top of ``minidl/``) never imports this package. It lives inside ``minidl`` so that
worker processes can import what a notebook hands them: a class defined in a notebook cell cannot
be pickled under ``spawn``/``forkserver``.
"""
