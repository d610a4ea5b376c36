"""Linux results that notebooks 09 and 10 show where this platform can't measure them (no ``/proc`` on a Mac).

Each text is a cell's output from a full run on Linux, copied here as printed; ``show`` prints it under a label
that names the machine, so it can't be read as the learner's own. What the platform lacks is asked of ``osfacts``.
"""

from __future__ import annotations

from minidl_course import osfacts

RUN = "AMD EPYC, 2 cores · Linux · Python 3.11.7 (GIL) · torch 2.13.0+cpu"  # where these texts were printed

TEXTS = {
    # 09: a held tensor batch and the ones made ahead, seen through /proc/<pid>/fd, /proc/<pid>/maps and /dev/shm
    "09 shared memory": """\
sharing strategy: file_descriptor
main process (pid 18506)
  mapped:          ['/dev/shm/torch_18591_1815773233_0 (deleted)', '/dev/shm/torch_18592_112010429_1 (deleted)', \
'/dev/shm/torch_18592_2690536596_0 (deleted)']
  open descriptors: ['/dev/shm/torch_18591_1815773233_0 (deleted)', '/dev/shm/torch_18592_112010429_1 (deleted)', \
'/dev/shm/torch_18592_2690536596_0 (deleted)']
worker 0 (pid 18591)
  mapped:          []
  open descriptors: ['/dev/shm/torch_18591_1043002131_1 (deleted)', '/dev/shm/torch_18591_127062250_2 (deleted)']
worker 1 (pid 18592)
  mapped:          []
  open descriptors: []
their files listed in /dev/shm: []""",
    # 09: the file_system strategy's named files in /dev/shm, and their going
    "09 file_system": """\
strategies: ['file_descriptor', 'file_system'] · default: file_descriptor
file_system, two batches held; their files in /dev/shm: ['torch_18599_2930361327_7', 'torch_18600_962923187_7']
  open descriptors to them in this process: 0
batches freed; their files gone from /dev/shm: True""",
    # 10: page tables (VmPTE) of the main process and two freshly forked workers
    "10 page tables": """\
process    resident    mapped     VmPTE   resident/4 KiB x 8 B   mapped/4 KiB x 8 B
main        304 MiB  1632 MiB  1028 KiB      608 KiB                3268 KiB
worker 0    231 MiB  1496 MiB   832 KiB      464 KiB                2996 KiB
worker 1    230 MiB  1496 MiB   824 KiB      460 KiB                2996 KiB

the largest page tables here: 1.00 MiB, for 304 MiB resident; the workers' are smaller than the main process's""",
}


def first_line(fact: osfacts.Fact | None, lesson: str) -> str:
    """A Linux-only lesson's first line: whether this platform can show it, and if not, why and what follows."""
    if fact is None or fact:
        return f"{osfacts.LINUX_ONLY}: {lesson}. This machine can show it (measured below)."
    return f"{osfacts.LINUX_ONLY}: {lesson}. {fact.line()} Below: the committed Linux result, not this machine's."


def show(name: str) -> None:
    """Print the recorded Linux output ``name`` under a label naming the machine it came from."""
    print(f"--- committed Linux result ({RUN}):")
    print(TEXTS[name])


def missing(*facts: osfacts.Fact) -> osfacts.Fact | None:
    """The first of ``facts`` this platform lacks (a Fact, falsy), or None when it has them all."""
    return next((fact for fact in facts if not fact), None)
