"""Sets multiprocessing's default start method for every Python process of a test run, from MINIDL_START_METHOD.

`make` puts this folder on PYTHONPATH for the start-method runs (`make unit-spawn`, `make nbval-forkserver`, ...), so
the notebook kernels, the pytest process and every process they start default to `spawn` (macOS, Windows) or
`forkserver` (Linux from Python 3.14) exactly as on those platforms, with nothing added to the notebooks' code.
Python imports a module named ``sitecustomize`` at start-up (see the ``site`` module's documentation).
"""

import os

_method = os.environ.get("MINIDL_START_METHOD")
if _method:
    import multiprocessing

    multiprocessing.set_start_method(_method, force=True)
    if _method == "forkserver":
        # The server imports these once and forks every worker from itself, so a worker doesn't import torch
        # anew. It changes only how long a start takes (what gets pickled is the same): it keeps CI short.
        multiprocessing.set_forkserver_preload(["numpy", "torch", "minidl"])
