"""``suite``: every scenario x algorithm x seed, resumable, with its plan, ETA and outputs (``run.py``),
the cost model of its ETA (``cost.py``), the seeds added until the comparisons are decided
(``until_decided.py``), the seeds a target MDE would take (``target.py``), and where the cells run
(``backends.py``: in this process, or ``ray_backend.py``: as Ray tasks over a cluster).

May import: reporting and everything below it.
"""
