"""Huge pages for torch's large CPU tensors, asked for before torch allocates any.

torch's CPU allocator maps every large tensor afresh, and the kernel then faults its memory in one 4 KiB
page at a time, zeroing each, the first time it is touched. A step allocates several gigabytes this way at a
real vocabulary (logits, activations, and the whole model's gradient once per micro-batch), and on a virtual
machine a fault costs more than the page's arithmetic. With ``THP_MEM_ALLOC_ENABLE=1`` torch aligns
allocations of 2 MiB and more to 2 MiB and advises the kernel to back them with transparent huge pages, 512
times fewer faults, where the kernel allows it (``/sys/kernel/mm/transparent_hugepage/enabled`` at
``madvise`` or ``always``). On this project's 2-core CPU machine a fresh (151,936 x 1,024) float32 tensor of
zeros took 0.59-0.78 s without and 0.21-0.37 s with, and a matrix product into a fresh gradient of that
size, added to another, 2.0-2.4 s against 1.2-1.5 s (two readings of each). Nothing a run computes changes:
only where its tensors live. The variable is read once, at torch's first large allocation, so
``python -m gspo_bench`` (and the ``gspo-bench`` script) sets it before anything imports torch, and the
processes it starts inherit it; a value the user set is kept (``THP_MEM_ALLOC_ENABLE=0`` turns it off).
A ``bench`` that times transformers, vLLM or TRL beside ours asks for none (``wants_huge_pages``): their
users run them without.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"


OURS_ONLY = ("--memory", "--whole", "--presets", "--async", "--suite-ray")
"""The ``bench`` measurements that time only this harness; the others (its default, ``--engines``, ``--vs``)
time another implementation beside ours in one process."""


def wants_huge_pages(argv: Sequence[str]) -> bool:
    """Whether the command ``argv`` (the arguments after the program) asks for huge pages: every command but
    a ``bench`` that times another implementation beside ours in this process (transformers' ``generate``
    and forward, vLLM, TRL's trainer), which must run it as its own users do, without them. Under huge pages
    TRL's GRPO cycle took 1.4-1.6x as long on this project's CPU machine (1.9-2.2 s against 1.3-1.4 s; ours
    0.75-0.79 s against 0.72 s), and ``generate`` on tiny-moe about a tenth longer while our engine took a
    little less, so the ratios would flatter us."""
    command = next((a for a in argv if not a.startswith("-")), None)  # the subcommand: the first word
    if command != "bench":
        return True
    return any(a.split("=")[0] in OURS_ONLY for a in argv)


def prefer_huge_pages(environ: MutableMapping[str, str] = os.environ, argv: Sequence[str] = ()) -> bool:
    """Ask torch for huge pages (``HUGE_PAGES=1``) where the command wants them (``wants_huge_pages``) unless
    ``environ`` says otherwise; whether they are on."""
    if wants_huge_pages(argv):
        environ.setdefault(HUGE_PAGES, "1")
    return environ.get(HUGE_PAGES) == "1"
