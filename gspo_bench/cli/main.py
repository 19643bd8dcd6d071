"""Command line: ``python -m gspo_bench {run,suite,tune,list,leaderboard,report,claims,variance,bench,warmstart,
collapse-check}``
(also installed as ``gspo-bench``).

Bad input prints one line naming the bad value and the allowed ones, and
exits with code 2, before anything is written to MLflow.
"""

from __future__ import annotations

import argparse
import os
import sys

from rich.table import Table

from gspo_bench.cli.info import add_claims_parser, add_staleness_parser, add_variance_parser
from gspo_bench.cli.measure import add_bench_parser
from gspo_bench.config import DEFAULT_TRACKING_URI, ConfigError, load_config, parse_sets, presets
from gspo_bench.config.sections import repeated
from gspo_bench.train.interrupts import Interrupted, handle_signals
from gspo_bench.tracking.provenance import git_commit
from gspo_bench.tracking.redact import RedactingConsole, redact
from gspo_bench.reporting.frame import RUNS_FILE
from gspo_bench.reporting.leaderboard import DEFAULT_BASELINE, DEFAULT_EXPERIMENT, NOTES
from gspo_bench.reporting.scaling import N_BOOT, SPLIT
from gspo_bench.reporting.scaling_table import FIT_METRIC, X_CHOICES

console = RedactingConsole(highlight=False)  # every printed line passes through redact: no credentials
if not console.is_terminal:  # logs and CI: don't squeeze tables into 80 columns
    console = RedactingConsole(highlight=False, width=160)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):  # every subcommand's parser is one too (add_subparsers' parser_class)
        kwargs.setdefault("allow_abbrev", False)  # `run --algo grpo` is an error, not --algos grpo
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line, exit 2 (argparse's default prints usage too)
        console.print(f"gspo-bench: error: {message} (see --help)", style="red", soft_wrap=True, markup=False)
        sys.exit(2)


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _csv_once(s: str) -> list[str]:
    """A comma list of a flag, each item once: a repeat (``--memory none,none``) is an error, not a second run."""
    items = _csv(s)
    if len(set(items)) < len(items):
        raise argparse.ArgumentTypeError(f"names {repeated(items)} more than once")
    return items


def _eps(s: str):
    return None if s.lower() in ("none", "null") else float(s)


def _seeds(s: str) -> list[int]:
    """A comma list of seeds, taken as is: '3' is seed 3, '0,1,2' three seeds."""
    try:
        return [int(x) for x in _csv(s)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be integers, got {s!r}") from None


def _set_flag(c: argparse.ArgumentParser) -> None:
    c.add_argument("--set", action="append", default=[], dest="sets", metavar="[SECTION.]FIELD=VALUE",
                   help="any config field, repeatable, e.g. --set rollout.temperature=0.7 --set 'seeds=[0,1]'; "
                   "VALUE is YAML (3e-4, null, true, [0,1]); merged over --preset and --config, under the "
                   "dedicated flags (--lr wins over --set train.lr=...)")


def _shared_flags(c: argparse.ArgumentParser) -> None:
    """Flags ``run`` and ``tune`` share (``overrides_from`` turns them into config overrides)."""
    c.add_argument("--preset", default="default", help=f"one of: {', '.join(presets())}")
    c.add_argument("--config", action="append", default=[], metavar="YAML",
                   help="config file(s) merged over the preset, e.g. baselines/gspo.yaml")
    _set_flag(c)
    c.add_argument("--task", help="built-in task name or a task spec YAML path")
    c.add_argument("--model", help="a built-in model (`list` names them) | local path | hub id")
    c.add_argument("--trust-remote-code", action="store_true", help="allow code shipped with a hub model")
    c.add_argument("--steps", type=int, help="RL steps per algorithm")
    c.add_argument("--lr", type=float, help="policy learning rate")
    c.add_argument("--minibatches", type=int, help="optimiser steps per rollout")
    c.add_argument("--engine", help="generation engine: auto or a registered one, see `list` (default auto: the "
                   "first that supports the model)")
    c.add_argument("--no-warmstart", action="store_true", help="skip the supervised warm start")
    c.add_argument("--on-collapse", help="continue | stop")
    c.add_argument("--tracking-uri", help=f"MLflow URI (default $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})")
    c.add_argument("--experiment", help="MLflow experiment name")
    c.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gspo-bench", description="Side-by-side RL policy-optimisation benchmark "
                                               "(PPO, GRPO, DAPO, GSPO, GSPO-token, CISPO, SAPO, GMPO, "
                                               "Dr. GRPO, VESPO, DPPO, LUSPO; `list` names them all).")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="warm start, then train each algorithm from it; track in MLflow")
    r.add_argument("--algos", default=None, help="'all' or a comma list, e.g. grpo,gspo (default: the preset's)")
    _shared_flags(r)
    rg = r.add_mutually_exclusive_group()
    rg.add_argument("--seed", type=_seeds, help="seed or comma list of seeds")
    rg.add_argument("--seeds", type=int, help="run seeds 0..N-1")
    r.add_argument("--eps-low", type=_eps, default=argparse.SUPPRESS,
                   help="lower clip offset ('none' = no lower bound)")
    r.add_argument("--eps-high", type=float, help="upper clip offset")
    r.add_argument("--devices", type=int, help="processes per machine (Lightning devices; default 1): each "
                   "samples its share of every step's prompts")
    r.add_argument("--strategy", help="auto | ddp | fsdp (GPU only); auto is ddp with more than one process")
    r.add_argument("--num-nodes", type=int, help="machines, launched by torchrun or SLURM (docs/scaling-out.md)")
    r.add_argument("--resume", action="store_true", help="continue each algorithm x seed's unfinished run "
                   "(KILLED, FAILED, or RUNNING with its process gone) with the same settings in this experiment, "
                   "as the same MLflow run, from its last checkpoint (train.checkpoint_every); a run without one "
                   "starts afresh; an unusable checkpoint (unreadable, or from other settings) is named and the one "
                   "before it tried")
    r.add_argument("--restart", action="store_true", help="with --resume: a run whose checkpoints are all unusable "
                   "starts afresh from RL step 0 as the same MLflow run (without it, --resume stops and says so)")
    from gspo_bench.tuning.study import COLLAPSE_PENALTY, DEFAULT_STORAGE, LAST_EVALS, PRUNERS

    t = sub.add_parser("tune", help="Optuna study over an algorithm's clip range (pruned, resumable, parallel)",
                       description="One Optuna study per algorithm over its clip range, each trial an MLflow run "
                       "nested under the study's run. Objective (maximised): mean eval/reward_mean over the last "
                       f"{LAST_EVALS} evals, minus {COLLAPSE_PENALTY} per collapse event. Workers sharing --storage "
                       "and --study share the trials; re-running continues the study.")
    t.add_argument("--algo", required=True, help="an algorithm, or 'all' (one study each)")
    t.add_argument("--trials", type=int, help="trials this process runs (default 8, or unlimited with --timeout)")
    t.add_argument("--timeout", type=float, help="stop starting trials after S seconds (per study)")
    t.add_argument("--study", help="study name (default <algo>-<task>-<model>-<preset>; with --algo all, NAME-<algo>)")
    t.add_argument("--storage", default=DEFAULT_STORAGE, help=f"SQLAlchemy URL (default {DEFAULT_STORAGE})")
    t.add_argument("--params", type=_csv_once, help="comma list of parameters to search, e.g. eps_high "
                   "(default: the algorithm's clip offsets; 'lr' adds the learning rate)")
    t.add_argument("--tune-lr", action="store_true", help="also search the learning rate (log-uniform, 5x around)")
    t.add_argument("--pruner", default="median", help=f"{PRUNERS} (default median: 3 startup trials, no pruning "
                   "before the halfway RL step)")
    t.add_argument("--heartbeat", type=int, default=60, help="worker heartbeat in s; a trial silent for 2x is "
                   "failed and retried (default 60)")
    t.add_argument("--retries", type=int, default=2, help="retries of a trial whose worker died (default 2)")
    t.add_argument("--sampler-seed", type=int, help="seed of the TPE sampler (leave unset with several workers)")
    t.add_argument("--out", default="results/tuning", help="folder of the best-params YAML (default results/tuning)")
    _shared_flags(t)
    t.add_argument("--seed", type=int, help="the one seed every trial trains with (default: the preset's first)")
    add_bench_parser(sub, _csv_once, _set_flag)
    w = sub.add_parser("warmstart", help="warm start (or load from the cache) each model x seed and show where "
                       "greedy pass@1 lands: the warm-start band",
                       description="Runs the supervised warm start of --preset for every --model and seed (cached "
                       "ones are loaded, not re-run) and prints greedy pass@1, steps and seconds per seed, then "
                       "min / mean / max per model. The same checkpoints serve later `run`s with the same preset.")
    w.add_argument("--preset", default="default", help=f"one of: {', '.join(presets())} (default default)")
    w.add_argument("--config", action="append", default=[], metavar="YAML", help="config file(s) over the preset")
    w.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config override")
    w.add_argument("--task", help="task (default: the preset's)")
    w.add_argument("--model", type=_csv_once, help="model(s), comma list (default: the preset's)")
    w.add_argument("--seeds", type=int, default=8, help="seeds 0..N-1 (default 8)")
    w.add_argument("--markdown", metavar="FILE", help="also write the tables as Markdown")
    w.add_argument("--no-progress", action="store_true", help="no progress bars")
    from gspo_bench.suite.run import DEFAULT_OUT, DEFAULT_PREFIX, DEFAULT_SEEDS, SCENARIOS

    s = sub.add_parser("suite", help="every scenario x algorithm x seed, resumable; a leaderboard and report per "
                       "scenario and a summary ranking the algorithms across scenarios",
                       description="Runs every scenario (a preset) x algorithm x seed, one cell (one MLflow run) "
                       "at a time (or, with --backend ray, as Ray tasks over a cluster), into the experiment "
                       "<prefix>-<scenario>. Resumable: a cell with a FINISHED run "
                       "(tags algo, seed, preset) is skipped, FAILED/KILLED/RUNNING ones run again. Prints the plan "
                       "and a rough ETA first. Then writes <out>/<scenario>/leaderboard.md and report.md, and "
                       "<out>/summary.md and suite.json: per algorithm its rank per scenario (mean final eval "
                       "pass@1), mean rank, scenarios where it is significantly best/worst (paired 95 % t interval "
                       "vs the runner-up/second-worst excludes 0) and collapse events. Exit 0 when every cell is "
                       "FINISHED, 1 otherwise, 2 on bad input.")
    s.add_argument("--scenarios", type=_csv, default=list(SCENARIOS), metavar="NAME[,NAME...]",
                   help=f"presets to run (default: {','.join(SCENARIOS)})")
    s.add_argument("--algos", default="all", help="'all' (default) or a comma list, e.g. grpo,gspo")
    sg = s.add_mutually_exclusive_group()
    sg.add_argument("--seeds", type=int, help=f"run seeds 0..N-1 (default {DEFAULT_SEEDS})")
    sg.add_argument("--seed", type=_seeds, help="comma list of seeds, e.g. 0,1,2")
    s.add_argument("--experiment-prefix", default=DEFAULT_PREFIX,
                   help=f"MLflow experiment of a scenario: <prefix>-<scenario> (default {DEFAULT_PREFIX})")
    s.add_argument("--tracking-uri", help=f"MLflow URI (default $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})")
    s.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    s.add_argument("--set", action="append", default=[], dest="sets", metavar="[SECTION.]FIELD=VALUE",
                   help="any config field over every scenario's preset, repeatable, e.g. --set train.steps=2 for "
                   "a smoke check (use another --experiment-prefix for it: a cell FINISHED with other settings "
                   "is an error, not skipped)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar (one line per cell still printed)")
    s.add_argument("--dry-run", action="store_true", help="print the plan and the ETA; run and write nothing")
    s.add_argument("--until-decided", action="store_true",
                   help="after the seeds above, add seeds in batches only to the algorithms whose final-pass@1 "
                   f"difference to {DEFAULT_BASELINE} is undecided under an anytime-valid t confidence sequence "
                   "(Lai 1976; Holm over each scenario's comparisons), until all are decided or --max-seeds; "
                   "the summary reports the intervals and decisions")
    s.add_argument("--max-seeds", type=int, metavar="N",
                   help="with --until-decided: the most seeds a scenario gets, the configured ones included")
    s.add_argument("--seed-batch", type=int, metavar="B",
                   help="with --until-decided: seeds added per round (default 2)")
    s.add_argument("--target-mde", type=float, metavar="X",
                   help="with --dry-run: per scenario, the seeds, cells and hours to detect X points of final "
                   f"pass@1 against {DEFAULT_BASELINE} with 80 %% power (fixed-n paired t at Holm's first step), "
                   "from the observed sd of the runs it has")
    s.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="where the cells run: local (default), one at a time in this process; ray, each cell a Ray "
                   "task on a cluster (pip install '.[ray]'; docs/many-machines.md). Either way each cell is claimed "
                   "in the tracking store before it runs, so drivers sharing a plan and store run it once")
    s.add_argument("--ray-address", metavar="ADDRESS",
                   help="with --backend ray: the cluster, HOST:PORT of a head started by `ray start --head`, "
                   "ray://HOST:PORT, auto, or local (a cluster of this machine, started for the command) (default "
                   "$RAY_ADDRESS, else local); an address of another machine needs a shared tracking store (an "
                   "mlflow server or PostgreSQL), not a sqlite file")
    s.add_argument("--cpus-per-cell", type=float, metavar="N",
                   help="with --backend ray: CPUs a cell's task asks for (default 1 on GPUs, else train.devices)")
    s.add_argument("--gpus-per-cell", type=float, metavar="N",
                   help="with --backend ray: GPUs a cell's task asks for (default train.devices where "
                   "train.accelerator is gpu, or auto on a cluster with GPUs; else 0)")
    add_claims_parser(sub, DEFAULT_TRACKING_URI)
    add_staleness_parser(sub, DEFAULT_TRACKING_URI)
    add_variance_parser(sub)
    sub.add_parser("list", help="show algorithms, tasks, models and presets (with one-line descriptions)")
    cc = sub.add_parser("collapse-check", help="replay the collapse detector over recorded runs and list the events",
                        description="Feeds the finished runs of --experiment (or a --histories file), step by step, "
                        "to today's collapse detector (thresholds: the collapse section, --set collapse.X=...) and "
                        "prints the events it opens per run, with eval pass@1 start -> end. Runs labelled "
                        "collapsed/healthy (in a --histories file) are scored: caught / missed / false positive.")
    cc.add_argument("--tracking-uri", help=f"MLflow URI (default $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})")
    cc.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help=f"MLflow experiment (default {DEFAULT_EXPERIMENT})")
    cc.add_argument("--histories", help="replay a JSON file written by --export instead of MLflow runs")
    cc.add_argument("--export", help="write the runs' detector inputs (and labels) to this JSON file")
    _set_flag(cc)
    for name, text in (("leaderboard", "one row per algorithm per task/model/preset/config, from MLflow"),
                       ("report", "report.md + figures from MLflow, also logged as a kind=report run")):
        c = sub.add_parser(name, help=text, description=f"{text}. {NOTES}")
        c.add_argument("--tracking-uri", help=f"MLflow URI (default $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})")
        c.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                       help=f"MLflow experiment (default {DEFAULT_EXPERIMENT})")
        c.add_argument("--task", help="only runs of this task")
        c.add_argument("--model", help="only runs of this model")
        c.add_argument("--runs", metavar="FILE", action="append", help="read the runs from a runs.csv.gz a report "
                       "wrote (a results folder's raw data) instead of an MLflow store: nothing is logged to MLflow; "
                       "repeatable: the tables are joined (a run in two of them is an error, exit 2)")
        c.add_argument("--baseline", metavar="ALGO|TAG=VALUE",
                       help=f"the algorithm the paired differences are taken against (default {DEFAULT_BASELINE}); "
                       "given, it must have a FINISHED run in the selection, else exit 2; left at the default, a "
                       "selection without one only skips the paired table. TAG=VALUE, with TAG one of the --by "
                       "tags, compares splits instead of algorithms: per algorithm and seed, each split minus the "
                       "split with TAG=VALUE and the other --by tags equal, e.g. --by routing_replay,correction "
                       "--baseline routing_replay=none compares r3/tis with none/tis (same algorithm, same seed)"
                       + ("; the report adds that table to each group's 'Splits compared' section, and its "
                          f"per-split paired sections stay vs {DEFAULT_BASELINE}" if name == "report" else "")
                       + "; a TAG not in --by, or a VALUE no run has, is an error (exit 2)")
        c.add_argument("--by", type=_csv_once, default=[], metavar="TAG[,TAG...]",
                       help="split every task/model/preset/config group further by the values of these run tags, "
                       "e.g. --by routing_replay,rollout_dtype: one row per algorithm and (routing_replay, "
                       "rollout_dtype) pair, the tags as extra columns after config, and paired differences "
                       "taken within each split (gspo under r3 vs grpo under r3)"
                       + ("; one report section and one set of figure files per split" if name == "report" else "")
                       + ". Any run tag works; a run without the tag shows '-' and forms a split of its own; a "
                       "tag no run has is an error (exit 2)")
        if name == "leaderboard":
            c.add_argument("--format", choices=("table", "md", "csv"),
                           help="default: a table on a terminal, Markdown otherwise; table and md print the "
                           "leaderboard, then the paired table and one MDE line per group; csv prints the "
                           "leaderboard alone")
            c.add_argument("--paired", action="store_true",
                           help="print only the paired differences vs --baseline, in --format; the baseline must "
                           "then have a FINISHED run (csv: one row per group, algorithm and metric, raw numbers: "
                           "pass@1 as a fraction, steps as steps, significant true/false (empty under 2 pairs), "
                           "with the group's MDE for final pass@1 in every row)")
            c.add_argument("--target-mde", type=float, metavar="X",
                           help="instead of the tables: per paired comparison, the seeds it needs to detect a "
                           "difference of X (points of pass@1, or steps) with 80 %% power at the level that "
                           "decides it (Holm's first step), from the observed sd of its per-seed differences, "
                           "and the same at the ends of that sd's 95 %% interval (md or csv)")
            c.add_argument("--fit", nargs="?", const=FIT_METRIC, metavar="METRIC",
                           help="instead of the tables: per group and algorithm, ScaleRL's compute-scaling curve "
                           "R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) fitted to METRIC (default "
                           f"{FIT_METRIC}; e.g. eval/mean_at_4) against the rollout compute, per seed and pooled, "
                           "with bootstrap intervals over seeds, and the final evaluation predicted from the "
                           "first half of the steps (md or csv); a METRIC no FINISHED run has is an error (exit 2)")
            c.add_argument("--fit-x", choices=X_CHOICES,
                           help="with --fit: the fit's compute axis: completions generated, or generated tokens "
                           "(needs the response/length_mean history); auto (default): tokens where every run of the "
                           "group has them, else completions")
            c.add_argument("--fit-resamples", type=int, metavar="N",
                           help=f"with --fit: bootstrap resamples of the seeds per algorithm (default {N_BOOT}; 0: no "
                           "intervals)")
            c.add_argument("--fit-split", type=float, metavar="F",
                           help=f"with --fit: the extrapolation check fits the evaluations at steps <= F x the final "
                           f"step (default {SPLIT:g})")
        else:
            c.add_argument("--out", help="output folder (default results/<experiment>)")
            c.add_argument("--storage", help="also report the Optuna studies in this storage (trial history, "
                           "parameter importance), e.g. sqlite:///optuna.db")
            c.add_argument("--study", action="append", help="only this study (repeatable; default: all in --storage)")
    return p


def overrides_from(args) -> dict:
    """The nested overrides of ``--set`` items, then of the dedicated flags (which win where both are given)."""
    o: dict = parse_sets(getattr(args, "sets", None) or [])

    def put(path: str, value):
        if value is None:
            return
        *heads, last = path.split(".")
        d = o
        for h in heads:
            d = d.setdefault(h, {})
        d[last] = value

    if getattr(args, "algos", None) is not None:
        from gspo_bench import algorithms

        put("algos", algorithms.names() if args.algos == "all" else _csv(args.algos))
    put("task", args.task)
    put("model.name", args.model)
    put("model.trust_remote_code", True if args.trust_remote_code else None)
    put("train.steps", args.steps)
    seed = args.seed
    put("seeds", [seed] if isinstance(seed, int) else seed)
    put("seeds", list(range(args.seeds)) if getattr(args, "seeds", None) is not None else None)
    put("train.lr", args.lr)
    put("train.minibatches", args.minibatches)
    put("train.devices", getattr(args, "devices", None))
    put("train.strategy", getattr(args, "strategy", None))
    put("train.num_nodes", getattr(args, "num_nodes", None))
    if hasattr(args, "eps_low"):  # present only when given; None means "no lower bound"
        o.setdefault("loss", {})["eps_low"] = args.eps_low
    put("loss.eps_high", getattr(args, "eps_high", None))
    put("rollout.engine", args.engine)
    put("warmstart.enabled", False if args.no_warmstart else None)
    put("collapse.on_collapse", args.on_collapse)
    put("tracking.tracking_uri", args.tracking_uri)
    put("tracking.experiment", args.experiment)
    put("train.progress", False if args.no_progress else None)
    return o


def cmd_run(args) -> int:
    if args.seeds is not None and args.seeds < 1:
        raise ConfigError(f"--seeds={args.seeds} must be >= 1")
    if args.restart and not args.resume:
        raise ConfigError("--restart goes with --resume (it restarts the runs --resume finds without a usable "
                          "checkpoint)")
    from gspo_bench.cli.run import run_command

    return run_command(load_config(args.preset, tuple(args.config), overrides_from(args)), args, console)


def cmd_tune(args) -> int:
    import shlex

    from gspo_bench.tuning.study import TuneRequest, fmt_params
    from gspo_bench.tuning.tune import tune

    req = TuneRequest(algo=args.algo, trials=args.trials, timeout=args.timeout, study=args.study, storage=args.storage,
                      preset=args.preset, config_files=tuple(args.config), overrides=overrides_from(args),
                      params=None if args.params is None else tuple(args.params), tune_lr=args.tune_lr,
                      pruner=args.pruner, heartbeat=args.heartbeat, retries=args.retries, out=args.out,
                      sampler_seed=args.sampler_seed, command="python -m gspo_bench " + shlex.join(args.argv))
    outcomes = tune(req, log=console.print)
    table = Table(title=f"tune: {redact(args.storage)}")
    for col in ("study", "complete", "pruned", "failed", "best value", "best trial", "best parameters",
                "best-params file", "wall s"):
        table.add_column(col)
    for o in outcomes:
        c = o.counts
        none = o.best_value is None
        table.add_row(o.name, str(c["COMPLETE"]), str(c["PRUNED"]), str(c["FAIL"]),
                      "-" if none else f"{o.best_value:.4f}", "-" if none else str(o.best_trial),
                      fmt_params(o.best_params) or "-",
                      str(o.path) if o.path else "none (no trial completed)", f"{o.seconds:.0f}")
    console.print(table)
    console.print(f"Optuna: optuna-dashboard {redact(args.storage)}   MLflow: one parent run per study "
                  f"(tag kind=study), its trials nested under it", soft_wrap=True)
    return 0 if all(o.best_value is not None for o in outcomes) else 1


def cmd_bench(args) -> int:
    from gspo_bench.cli.measure import bench_command

    return bench_command(args, console)


def cmd_warmstart(args) -> int:
    from gspo_bench.cli.measure import warmstart_command

    return warmstart_command(args, console)


def cmd_suite(args) -> int:
    import shlex

    from gspo_bench.suite.run import DEFAULT_SEEDS, SuiteRequest, run_suite

    if args.seeds is not None and args.seeds < 1:
        raise ConfigError(f"--seeds={args.seeds} must be >= 1")
    seeds = args.seed if args.seed is not None else list(range(DEFAULT_SEEDS if args.seeds is None else args.seeds))
    req = SuiteRequest(scenarios=tuple(args.scenarios), algos=None if args.algos == "all" else _csv(args.algos),
                       seeds=seeds, prefix=args.experiment_prefix, tracking_uri=args.tracking_uri, out=args.out,
                       sets=tuple(args.sets), progress=not args.no_progress, dry_run=args.dry_run,
                       command="python -m gspo_bench " + shlex.join(args.argv), until_decided=args.until_decided,
                       max_seeds=args.max_seeds, seed_batch=args.seed_batch, target_mde=args.target_mde,
                       backend=args.backend, ray_address=args.ray_address, cpus_per_cell=args.cpus_per_cell,
                       gpus_per_cell=args.gpus_per_cell)
    return run_suite(req, log=lambda m: console.print(m, markup=False, highlight=False, soft_wrap=True),
                     console=console)


def _cli_info(name: str):
    """``list``, ``collapse-check``, ``leaderboard``, ``claims``, ``variance``: ``cli_info.<name>(args, console)``, on use."""
    def command(args) -> int:
        from gspo_bench.cli import info as cli_info

        return getattr(cli_info, name)(args, console)

    return command


cmd_list, cmd_collapse_check = _cli_info("list_command"), _cli_info("collapse_check_command")
cmd_leaderboard, cmd_claims = _cli_info("leaderboard_command"), _cli_info("claims_command")
cmd_variance, cmd_staleness = _cli_info("variance_command"), _cli_info("staleness_command")


def cmd_report(args) -> int:
    import shlex

    from gspo_bench.reporting.leaderboard import read_uri
    from gspo_bench.reporting.report import write_report

    if args.study and not args.storage:
        raise ConfigError("--study needs --storage (the Optuna storage URL holding the study)")
    rep = write_report(None if args.runs else read_uri(args.tracking_uri), args.experiment, args.out, args.task,
                       args.model, command="python -m gspo_bench " + shlex.join(args.argv), storage=args.storage,
                       studies=args.study, baseline=args.baseline or DEFAULT_BASELINE,
                       strict_baseline=args.baseline is not None, by=tuple(dict.fromkeys(args.by)),
                       runs_file=args.runs)
    logged = (f"; logged to MLflow run {rep.run_id} (name 'report', tag kind=report)" if rep.run_id else
              " (from a runs table: nothing logged to MLflow)")
    console.print(f"wrote {rep.path}, {len(rep.figures)} figures and the runs table {rep.path.parent / RUNS_FILE}"
                  + logged, soft_wrap=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # report: a bar per small download is noise
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # its "View run at <uri>" has the password
    from gspo_bench.cli.environment import broken_companions

    # first, before the parser (whose defaults come from modules that load transformers): else a 100-line traceback
    if (broken := broken_companions()) is not None:
        console.print(f"gspo-bench: error: {broken}", style="red", soft_wrap=True, markup=False)
        return 2
    args = build_parser().parse_args(argv)  # the files stating the command get it redacted; args keep the real values
    args.argv = [redact(a) for a in (sys.argv[1:] if argv is None else argv)]
    # the commit of the code this process loaded, asked before the command writes anything: a page that names
    # it is not marked +dirty by the figures the same command wrote just before it
    git_commit()
    commands = {"run": cmd_run, "tune": cmd_tune, "list": cmd_list, "leaderboard": cmd_leaderboard,
                "report": cmd_report, "bench": cmd_bench, "warmstart": cmd_warmstart, "suite": cmd_suite,
                "collapse-check": cmd_collapse_check, "claims": cmd_claims,
                "variance": cmd_variance, "staleness": cmd_staleness}
    try:  # SIGINT / SIGTERM: one summary, exit 130 / 143, no traceback (interrupts.py)
        with handle_signals(echo=lambda m: console.print(m, style="yellow")):
            if args.cmd in ("run", "tune", "bench", "list"):
                # import every algorithm file (each registers its class, maybe its loss) before a config names one
                from gspo_bench import algorithms  # noqa: F401
            return commands[args.cmd](args)
    except Interrupted as e:
        from gspo_bench.cli.run import interrupted

        return interrupted(e, args, console)
    except ConfigError as e:
        if "LOCAL_RANK" in os.environ:  # maybe a rank other than 0, whose console is muted: rank 0 prints it
            from gspo_bench.core.collectives import launch_rank_zero
            from gspo_bench.train.distributed import report_failure

            if not launch_rank_zero():
                report_failure(f"ConfigError: {e}")
        console.print(f"gspo-bench: error: {e}", style="red", soft_wrap=True, markup=False)
        return 2
    except Exception as e:  # a tracking server gone; a multi-process run: one rank failed, or this rank did
        return _ended_by(e)


def _ended_by(e: Exception) -> int:
    """Exit 1 with one line for a tracking server gone (``stores.TrackingUnreachable``) or a failed run of a
    multi-process command (``distributed.RankFailed``); on a rank other than 0 any error goes to rank 0's
    watch instead, which prints it. Anything else is a bug: its traceback is shown."""
    import traceback

    from gspo_bench.core.collectives import launch_rank_zero
    from gspo_bench.train import distributed
    from gspo_bench.tracking.stores import TrackingUnreachable

    if not launch_rank_zero() and os.environ.get(distributed.REPORTS_ENV):
        if not isinstance(e, TrackingUnreachable):
            failed = isinstance(e, distributed.RankFailed)
            distributed.report_failure(e.line if failed else distributed.error_line(e),
                                       e.trace if failed else traceback.format_exc())
        return 1
    if isinstance(e, (TrackingUnreachable, distributed.RankFailed)):
        distributed.stop_other_ranks()
        console.print(f"gspo-bench: error: {e}", style="red", soft_wrap=True, markup=False)
        return 1
    raise e


if __name__ == "__main__":
    sys.exit(main())
