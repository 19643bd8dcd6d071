"""``tune``'s entry point: validate the request, warm start once, then one Optuna study per algorithm.

It sits above both halves of the package: ``study.py`` (the request, storage,
pruner, objective value and best-params file) and ``trials.py`` (the
objective and the study loop, which itself builds on ``study.py``). The
design and the objective are described in ``study.py``'s docstring.
"""

from __future__ import annotations

import warnings

from gspo_bench.config import ConfigError, load_config
from gspo_bench.tuning.study import StudyOutcome, TuneRequest, chosen_params, make_pruner, open_storage
from gspo_bench.tuning.trials import prepare, run_study


def tune(req: TuneRequest, log=print) -> list[StudyOutcome]:
    """Validate everything, open the storage, warm start once, then one study per algorithm."""
    import optuna

    from gspo_bench import algorithms
    from gspo_bench.core.losses import LOSSES
    from gspo_bench.tracking.runs import quiet
    from gspo_bench.train.runner import validate

    quiet()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    known = algorithms.names()
    if req.algo != "all" and req.algo not in known:
        raise ConfigError(f"algo {req.algo!r} is not allowed (allowed: {', '.join(known)}, all)")
    algos = known if req.algo == "all" else [req.algo]
    if req.trials is not None and req.trials < 1:
        raise ConfigError(f"--trials={req.trials} must be >= 1")
    if req.timeout is not None and req.timeout <= 0:
        raise ConfigError(f"--timeout={req.timeout} must be > 0 seconds")
    if req.heartbeat < 1 or req.retries < 0:
        raise ConfigError(f"--heartbeat={req.heartbeat} must be >= 1 s and --retries={req.retries} >= 0")
    if req.trials is None and req.timeout is None:
        req.trials = 8
    cfg = load_config(req.preset, req.config_files, {**req.overrides, "algos": algos})
    uri = validate(cfg)
    spaces = {a: chosen_params(LOSSES[a], req.params, req.tune_lr) for a in algos}
    make_pruner(req.pruner, cfg.train.steps)
    storage = open_storage(req.storage, req.heartbeat, req.retries, uri,
                           connect_timeout_s=cfg.tracking.connect_timeout_s)
    shared = prepare(req, cfg, uri, storage, log)  # MLflow experiment, task, the one warm start
    return [run_study(shared, algo, spaces[algo]) for algo in algos]
