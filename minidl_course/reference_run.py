"""Notebook 01's last table: this run's speed-ups beside the committed reference run the README quotes.

The reference is ``results/x86_64-2c-py3.11-gil/kernels.csv``, one run of ``python -m minidl_bench kernels`` at
notebook 01's full-mode sizes. ``beside_reference`` reads it and sets its speed-ups over the pure-Python loop
beside this run's, each column named by its CPU.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent.parent / "results" / "x86_64-2c-py3.11-gil" / "kernels.csv"
ROWS = {"Pool, one worker per core": "pool", "Numba, one thread": "numba",
        "NumPy, one call per image": "numpy per sample", "NumPy, one call per batch": "numpy batch"}


def short_cpu(model: str) -> str:
    """A CPU model without its trademarks and filler words: "Intel(R) Xeon(R) Processor" -> "Intel Xeon".

    >>> short_cpu("Intel(R) Xeon(R) Processor")
    'Intel Xeon'
    """
    return " ".join(re.sub(r"\((R|TM)\)", "", model).replace("Processor", "").split())


def reference_medians(path: Path = REFERENCE) -> tuple[dict[str, float], dict[str, str]]:
    """The reference run's median seconds per method (a pool as "pool xN") and its first row (machine fields)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["task"] == "cpu-normalise"]
    medians = {(f"{r['method']} x{r['workers']}" if r["method"] == "pool" else r["method"]): float(r["median_s"])
               for r in rows}
    return medians, rows[0]


def beside_reference(medians: dict[str, float], cpu_model: str, cores: int, images: int, quick: bool) -> str:
    """This run's speed-ups (``medians``: method -> median seconds) beside the reference run's, as a table."""
    ref_medians, ref = reference_medians()
    runs = [(f"this run ({short_cpu(cpu_model)}, {cores} cores)", medians, max(2, cores)),
            (f"reference run ({short_cpu(ref['cpu_model'])}, {ref['cores']} cores)", ref_medians,
             max(2, int(ref["cores"])))]
    lines = [f"{'speedup over the pure-Python loop':<36}" + "".join(f"{name:>38}" for name, _, _ in runs)]
    for row, method in ROWS.items():
        cells = []
        for _, run, pool in runs:
            x = run["python serial"] / run[f"pool x{pool}" if method == "pool" else method]
            cells.append(f"x{x:.0f}" if x >= 10 else f"x{x:.2f} ({pool} workers)")
        lines.append(f"{row:<36}" + "".join(f"{c:>38}" for c in cells))
    lines.append(f"batch: {images} images here, {ref['size']} in the reference run"
                 + (" (quick mode: not comparable)" if quick else ""))
    return "\n".join(lines)
