"""``suite``: every scenario x algorithm x seed, resumable, with its plan, ETA and outputs (``run.py``),
the cost model of its ETA (``cost.py``), the seeds added until the comparisons are decided
(``until_decided.py``) and the seeds a target MDE would take (``target.py``).

May import: reporting and everything below it.
"""
