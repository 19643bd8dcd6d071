"""``suite``: every scenario x algorithm x seed, resumable, with its plan, ETA and outputs (``run.py``),
and the cost model of its ETA (``cost.py``).

May import: reporting and everything below it.
"""
