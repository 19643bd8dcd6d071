"""``run``'s command body, and what any command prints when a signal stops it."""

from __future__ import annotations

import shlex

from rich.table import Table

from gspo_bench.config import RunConfig


def run_command(cfg: RunConfig, args, console) -> int:
    from gspo_bench.core.collectives import launch_rank_zero
    from gspo_bench.tracking.runs import quiet
    from gspo_bench.train.runner import run, validate

    quiet()  # before the store is opened: MLflow's own INFO lines ("Updating database tables") are not ours
    uri = validate(cfg)
    console.quiet = not launch_rank_zero()  # the other processes of a multi-process run train silently
    console.print(f"[bold]gspo_bench[/bold] preset={cfg.preset} task={cfg.task} model={cfg.model.name} "
                  f"algos={','.join(cfg.algos)} seeds={cfg.seeds} steps={cfg.train.steps}"
                  + (" (resuming: FINISHED runs skipped, unfinished ones continued)" if args.resume else ""))
    # run's lines are plain text: an error message may hold brackets ("[/path/pair.cc:553]") that markup reads
    results = run(cfg, log=lambda m: console.print(m, markup=False, highlight=False), resume=args.resume,
                  restart=args.restart)
    console.print(results_table(results, f"{cfg.task} / {cfg.model.name} / preset {cfg.preset}"))
    if any(r.earlier for r in results):
        console.print("(earlier): FINISHED before this command; read back from the store, not trained again")
    console.print(mlflow_hint(uri, cfg.tracking.experiment, results), soft_wrap=True)
    return 0 if all(r.status == "FINISHED" for r in results) else 1


def mlflow_hint(uri: str, experiment: str, results: list) -> str:
    """Where to look at the runs: the UI page that opens on the runs table (and, for a local store, the
    command that serves it)."""
    from gspo_bench.tracking.redact import redact
    from gspo_bench.tracking.ui import ui_url

    exp_id = next((r.experiment_id for r in results if getattr(r, "experiment_id", None)), None)
    serve = "" if uri.startswith(("http://", "https://")) else f"mlflow ui --backend-store-uri {redact(uri)}, then "
    where = ui_url(uri, exp_id) if exp_id else f"experiment '{experiment}'"
    return f"MLflow: {serve}open {where}"


def results_table(results: list, title: str) -> Table:
    table = Table(title=title)
    for col in ("algo", "seed", "status", "reward first→last", "eval pass@1 start→end", "clip/frac (last)",
                "collapses", "wall s"):
        table.add_column(col)
    for r in results:
        f, l = r.first.get("reward/mean"), r.last.get("reward/mean")
        table.add_row(r.algo, str(r.seed), r.status + (" (earlier)" if r.earlier else ""),
                      f"{f:.3f}→{l:.3f}" if f is not None and l is not None else "-",
                      f"{r.eval_start:.3f}→{r.eval_end:.3f}" if r.eval_end is not None else "-",
                      f"{r.last.get('clip/frac', float('nan')):.4f}", str(r.collapse_events), f"{r.seconds:.0f}")
    return table


def interrupted(e, args, console) -> int:
    """What a signal's stop prints (no traceback): where it stopped, the runs that ended, how to go on."""
    console.print(f"gspo-bench: stopped by {e.name}{' ' + e.where if e.where else ''}", style="yellow")
    killed = [r for r in e.results if r.status == "KILLED"]
    for r in killed:
        at = (f"checkpoint at RL step {e.checkpoint_step}" if e.checkpoint_step else "no checkpoint yet: it "
              "will start over")
        console.print(f"  {r.algo} seed {r.seed}: run {r.run_id} marked KILLED ({at})")
    done = [r for r in e.results if r.status != "KILLED"]
    if done:
        console.print(results_table(done, "runs that ended before the signal"))
    else:
        console.print("  no run had ended before the signal")
    argv = list(getattr(args, "argv", []))
    if args.cmd == "run":
        again = argv if "--resume" in argv else argv + ["--resume"]
        console.print(f"resume: python -m gspo_bench {shlex.join(again)}", soft_wrap=True)
    elif args.cmd in ("suite", "tune"):
        console.print(f"resume: run the same command again: python -m gspo_bench {shlex.join(argv)}",
                      soft_wrap=True)
    return e.exit_code
