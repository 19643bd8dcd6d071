"""``tune``: Optuna studies over clip ranges (``study.py``: storage and outcomes; ``trials.py``: the
objective; ``tune.py``: the entry point over both).

May import: train and everything below it.
"""
