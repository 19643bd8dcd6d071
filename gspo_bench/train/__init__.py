"""Training runs: ``runner.py`` (``run``: a warm start per seed, each algorithm in Lightning, tracked
in MLflow), ``warmstart.py`` (the cached supervised warm start), ``checkpoint.py`` (what a checkpoint holds,
atomic saves, verified loads), ``interrupts.py`` (SIGINT/SIGTERM: a clean stop), ``distributed.py``
(multi-process runs: config checks, the strategy, a failed rank reported).

May import: algorithms, callbacks, rollout, tasks, models, tracking, config, core, paths.
"""
