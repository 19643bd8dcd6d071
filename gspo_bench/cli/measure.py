"""The measuring commands of the CLI: ``bench`` (throughput) and ``warmstart`` (where the warm start lands).

``__main__`` parses the flags and hands the namespace over; these functions
do the work and print with the console they are given.
"""

from __future__ import annotations

import os

from rich.table import Table

from gspo_bench.config import ConfigError, deep_merge, load_config, parse_sets
from gspo_bench.config.names import MOE_KERNELS


def add_bench_parser(sub, csv, set_flag) -> None:
    """The ``bench`` subcommand's flags (kept beside the commands that read them); ``csv`` parses a
    comma list and ``set_flag`` adds ``--set``, as for every subcommand."""
    from gspo_bench.config import presets

    b = sub.add_parser("bench", help="throughput: fast engine vs model.generate, training tokens/s, full RL step, MFU",
                       description="Measures in one process: (a) rollout generation with the fast engine and with "
                       "model.generate on the same batch, (b) training tokens/s, (c) the full RL step (median after "
                       "warm-up) on the fast path and the transformers path, (d) matmul FLOP/s and MFU, and rollout "
                       "time against max_new_tokens. Prints tables, then JSON (or writes it to --json).")
    b.add_argument("--preset", default=None, help=f"one of: {', '.join(presets())} (default cpu-bench; with --whole, "
                   "default)")
    b.add_argument("--whole", action="store_true", help="instead: time `run --algos all` (one seed) end to end and "
                   "split it into warm start, rollout, train, eval and overhead, with completions per hour")
    b.add_argument("--config", action="append", default=[], metavar="YAML", help="config file(s) over the preset")
    set_flag(b)
    b.add_argument("--model", type=csv, help="model(s), comma list, e.g. tiny-dense,tiny-moe (default: the preset's)")
    b.add_argument("--task", help="task (default: the preset's)")
    b.add_argument("--algo", default="grpo", help="algorithm of the full RL step (default grpo)")
    b.add_argument("--max-new-tokens", type=int, help="length cap of (a)-(c) (default: the preset's)")
    b.add_argument("--paths", type=csv, default=["fast", "hf"], help="fast,hf (default both)")
    b.add_argument("--warmup", type=int, default=1, help="unmeasured repeats first (default 1)")
    b.add_argument("--repeats", type=int, default=3, help="measured repeats of (a), (b) and scaling (default 3)")
    b.add_argument("--rl-steps", type=int, default=5, help="measured RL steps per path (default 5)")
    b.add_argument("--scaling", default="64,128,192,256", help="max_new_tokens of the scaling curve, or 'none'")
    b.add_argument("--json", metavar="FILE", help="write the JSON here instead of printing it")
    b.add_argument("--markdown", metavar="FILE", help="also write the tables as Markdown (e.g. results/bench.md)")
    b.add_argument("--figure", metavar="PNG", help="also draw the scaling curve(s)")
    b.add_argument("--profile", metavar="FILE", help="torch.profiler op table of one full RL step per path; with "
                   "--memory a folder: each measurement then profiles a second step (neither its memory nor its "
                   "seconds are the ones measured) into DIR/<controls>-<prompts>p.txt, the step's phases first, "
                   "then the operators of most CPU time, then the same by operator and input shapes")
    b.add_argument("--vs", metavar="trl", help="instead: the full RL step against TRL's GRPOTrainer (extra compare)")
    b.add_argument("--engines", type=csv, metavar="E[,E...]", help="instead: these rollout engines side by side "
                   "(fast, compiled, hf, vllm) on each --model: tokens/s, completions/s, vLLM's start-up and "
                   "weight-sync seconds, and the full RL step with vllm against fast (--rl-steps 0: generation only)")
    b.add_argument("--moe-kernels", type=csv, metavar="K[,K...]", help="with --engines: also the fast engine with a "
                   "MoE model's experts run by each kernel (auto, grouped, batched, loop), in rounds that take the "
                   "kernels in turn")
    b.add_argument("--append", action="store_true", help="append to --markdown instead of overwriting it")
    b.add_argument("--presets", type=csv, metavar="P[,P...]", help="instead: run each preset (e.g. gpu-dense,gpu-moe) "
                   "end to end at a cut size (bench/presets.py; --set over it), each in its own process: peak RSS, "
                   "wall time, seconds per RL step; --markdown writes them with the command and commit")
    b.add_argument("--memory", type=csv, metavar="C[,C...]", help="instead: the memory one RL step adds under each "
                   "set of memory controls (none, micro, chunk, ckpt, select, all, all-select; bench/memory.py), at each --prompts, "
                   "each in its own process (default model qwen3-0.6b-arch; --set over it)")
    b.add_argument("--prompts", type=csv, default=None, metavar="N[,N...]", help="with --memory: prompts per "
                   "rollout of each measurement (default 4,16)")
    b.add_argument("--rounds", type=int, default=None, metavar="N", help="with --memory: take every measurement "
                   "N times, round after round; the table gives medians, and the step-time bounds each control's "
                   "ratio to the uncontrolled step of the same round (default 1)")
    b.add_argument("--suite-ray", action="store_true", help="instead: the smoke suite's wall time serially against "
                   "`suite --backend ray` on a Ray head of this machine with --workers CPUs, --repeats times each, "
                   "each run a process of its own (bench/suite_ray.py; --set over the suite); --markdown writes the "
                   "page with the command and commit (the ray extra)")
    b.add_argument("--async", dest="async_ks", type=csv, metavar="K[,K...]", help="instead: one seed of --algo "
                   "with rollout.max_staleness = each K (0: the synchronous loop), each timed as run times it: RL "
                   "steps per hour, tokens/s, the overlap achieved, and the speedup a sampler on a device of its own "
                   "would give (bench/overlap.py; default preset default; --set over it); --markdown writes the page")
    b.add_argument("--partial", action="store_true", help="with --async: each K > 0 measured twice, without and "
                   "with partial rollouts (rollout.partial: responses under way continue under weights that arrive)")
    b.add_argument("--workers", type=int, metavar="N", help="with --suite-ray: CPUs of the Ray head, one "
                   "cell each at a time (default 2)")


def model_overrides(args, sets: dict, model: str | None) -> dict:
    """The config overrides of one ``--model`` of a bench: ``--set``'s, under ``--model``, ``--task`` and
    ``--max-new-tokens``, which win."""
    over: dict = {}
    if model:
        over["model"] = {"name": model}
    if args.task:
        over["task"] = args.task
    if args.max_new_tokens is not None:
        over["rollout"] = {"max_new_tokens": args.max_new_tokens}
    return deep_merge(sets, over)


SUITE_RAY_WORKERS = 2  # bench --suite-ray's Ray head: CPUs, one cell each at a time

MODES = (("--vs", "vs"), ("--whole", "whole"), ("--engines", "engines"), ("--presets", "presets"),
         ("--memory", "memory"), ("--suite-ray", "suite_ray"), ("--async", "async_ks"))
"""The measurements ``bench`` makes instead of its default one: one at a time."""
NEEDS = (("--moe-kernels", "moe_kernels", "--engines", "e.g. --engines fast --moe-kernels loop,auto"),
         ("--prompts", "prompts", "--memory", "e.g. --memory none,all --prompts 4,16"),
         ("--rounds", "rounds", "--memory", "e.g. --memory none,micro,all --rounds 3"),
         ("--workers", "workers", "--suite-ray", "e.g. --suite-ray --workers 2"),
         ("--append", "append", "--markdown", "the page it appends to"))
"""A flag that means something only beside another: (flag, its attribute, the flag it goes with, a hint)."""


def check_flags(args) -> None:
    """Two measurements asked at once, or a flag without the one it goes with: a ConfigError, before any work."""
    modes = [flag for flag, attr in MODES if getattr(args, attr, None) not in (None, False, [])]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} each ask for a measurement of their own: give one per command")
    for flag, attr, partner, hint in NEEDS:
        partner_attr = partner.lstrip("-").replace("-", "_")
        if getattr(args, attr, None) not in (None, False) and not getattr(args, partner_attr, None):
            raise ConfigError(f"{flag} goes with {partner} ({hint})")


def bench_command(args, console) -> int:
    """``bench``: measure, print the tables, write JSON / Markdown / figure / profile as asked."""
    import json
    import shlex
    from pathlib import Path

    from gspo_bench.bench.throughput import BenchOptions, run_bench
    from gspo_bench.bench.tables import markdown, plot_scaling, rich_tables
    from gspo_bench.tracking.provenance import git_commit

    check_flags(args)
    if args.vs is not None:
        from gspo_bench.bench.trl import vs_command

        return vs_command(args, console)
    if args.whole:
        return whole_command(args, console)
    if args.engines:
        return engines_command(args, console)
    if args.presets:
        return presets_command(args, console)
    if args.memory:
        return memory_command(args, console)
    if args.suite_ray:
        return suite_ray_command(args, console)
    if args.async_ks:
        return async_command(args, console)
    args.preset = args.preset or "cpu-bench"

    try:
        scaling = () if args.scaling.lower() == "none" else tuple(int(x) for x in args.scaling.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--scaling {args.scaling!r}: a comma list of token counts, or none") from None
    opts = BenchOptions(algo=args.algo, warmup=args.warmup, repeats=args.repeats, rl_steps=args.rl_steps,
                        scaling=scaling, paths=tuple(args.paths), profile=bool(args.profile))
    opts.check()
    sets = parse_sets(args.sets)  # before any work: a bad --set exits 2 at once
    from gspo_bench.bench.throughput import check_measurable

    for model in args.model or [None]:  # and every model's settings load, with an engine that runs here
        check_measurable(load_config(args.preset, tuple(args.config), model_overrides(args, sets, model)))
    results = []
    for model in args.model or [None]:
        over = model_overrides(args, sets, model)
        console.print(f"[bold]bench[/bold] preset={args.preset} model={model or '(preset)'} algo={args.algo}")
        res = run_bench(args.preset, tuple(args.config), over, opts, log=console.print).to_dict()
        for t in rich_tables(res):
            console.print(t)
        results.append(res)
    if args.profile:
        Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
        Path(args.profile).write_text("".join(
            f"# torch.profiler, one full RL step, {r['model']}, path {p}\n"
            f"# python -m gspo_bench {shlex.join(args.argv)} @ {git_commit()}\n\n{table}\n"
            for r in results for p, table in r.pop("profiles").items()))
        console.print(f"wrote {args.profile}")
    for r in results:
        r.pop("profiles", None)
    payload = results[0] if len(results) == 1 else results
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(payload, indent=2))
        console.print(f"wrote {args.json}")
    else:
        print(json.dumps(payload, indent=2))
    figure = None
    if args.figure and scaling:
        figure = plot_scaling(results, args.figure)
        console.print(f"wrote {figure}")
    if args.markdown:
        command = "python -m gspo_bench " + shlex.join(args.argv)
        rel = None
        if figure is not None:
            rel = os.path.relpath(figure, Path(args.markdown).resolve().parent)
        text = "\n".join(markdown(r, command, git_commit(), rel if i == len(results) - 1 else None)
                         for i, r in enumerate(results))
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text)
        console.print(f"wrote {args.markdown}")
    return 0


def write_outputs(args, console, res: dict, markdown) -> None:
    """``--json`` (the measurements) and ``--markdown`` (``markdown(res, command, commit)``), where asked; with
    ``--append`` the page goes below the one already there (the JSON is always the one measurement's)."""
    import json
    from pathlib import Path

    for path, text in ((args.json, lambda: json.dumps(res, indent=2)),
                       (args.markdown, lambda: markdown(res, res["command"], res["commit"]))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            body = text()
            if path == args.markdown and getattr(args, "append", False) and Path(path).exists():
                body = Path(path).read_text().rstrip() + "\n\n" + body
            Path(path).write_text(body)
            console.print(f"wrote {path}")


def async_command(args, console) -> int:
    """``bench --async``: the synchronous loop against asynchronous rollouts at each K (``bench/overlap.py``)."""
    import shlex

    from gspo_bench.bench import overlap as bench_overlap
    from gspo_bench.bench.throughput import check_measurable
    from gspo_bench.tracking.provenance import git_commit

    given = ",".join(args.async_ks)
    try:
        ks = tuple(int(k) for k in args.async_ks)
    except ValueError:
        raise ConfigError(f"--async takes whole numbers K >= 0, comma-separated; got {given}") from None
    if any(k < 0 for k in ks):
        raise ConfigError(f"--async takes whole numbers K >= 0 (0: the synchronous loop); got {given}")
    over = parse_sets(args.sets)
    if args.model:
        over["model"] = {"name": args.model[0]}
    if args.task:
        over["task"] = args.task
    preset = args.preset or "default"
    check_measurable(load_config(preset, tuple(args.config), over))  # bad settings: one line, before any work
    if args.partial:
        if not any(k > 0 for k in ks):
            raise ConfigError(f"--partial measures partial rollouts at each K > 0; --async {given} has none")
        from gspo_bench.rollout.engines import check_engine

        # an engine that cannot continue a response: one line now, not a failed run after the others
        check_engine(load_config(preset, tuple(args.config), deep_merge(over, {"rollout": {"max_staleness": 1,
                                                                                           "partial": True}})))
    console.print(f"[bold]bench --async[/bold] {','.join(map(str, ks))}{' with and without partial rollouts' if args.partial else ''} "
                  f"preset={preset} algo={args.algo}")
    res = bench_overlap.async_benchmark(preset, tuple(args.config), over, ks, args.algo, log=console.print,
                                        partial=args.partial)
    res.update(command="python -m gspo_bench " + shlex.join(args.argv), commit=git_commit())
    console.print(bench_overlap.summary(res), soft_wrap=True)
    write_outputs(args, console, res, bench_overlap.markdown)
    return 0 if all(r["status"] == "FINISHED" for r in res["rows"]) else 1


def whole_command(args, console) -> int:
    """``bench --whole``: ``run --algos all`` timed end to end, by phase."""
    import shlex

    from gspo_bench.bench import whole as bench_whole
    from gspo_bench.bench.throughput import check_measurable
    from gspo_bench.tracking.provenance import git_commit

    over = parse_sets(args.sets)
    if args.model:
        over["model"] = {"name": args.model[0]}
    if args.task:
        over["task"] = args.task
    preset = args.preset or "default"
    check_measurable(load_config(preset, tuple(args.config), over))  # bad settings: one line, before any work
    console.print(f"[bold]bench --whole[/bold] preset={preset}: run --algos all, one seed")
    res = bench_whole.whole_benchmark(preset, tuple(args.config), over, log=console.print)
    res.update(command="python -m gspo_bench " + shlex.join(args.argv), commit=git_commit())
    console.print(bench_whole.rich_table(res))
    console.print(bench_whole.summary(res), soft_wrap=True)
    write_outputs(args, console, res, bench_whole.markdown)
    return 0 if all(s == "FINISHED" for s in res["statuses"]) else 1


def presets_command(args, console) -> int:
    """``bench --presets``: each preset run at the cut size in a process of its own, timed; exit 1 unless every
    run FINISHED."""
    import shlex
    from pathlib import Path

    from gspo_bench.bench import presets as bench_presets
    from gspo_bench.bench.throughput import check_measurable
    from gspo_bench.config import presets
    from gspo_bench.tracking.provenance import git_commit, machine

    unknown = [p for p in args.presets if p not in presets()]
    if unknown:
        raise ConfigError(f"--presets: unknown {', '.join(unknown)} (presets: {', '.join(presets())})")
    if args.config:
        raise ConfigError("--presets runs each preset as it ships (with --set over the cut size); --config is not "
                          "passed on")
    sets = tuple(args.sets)
    for name in args.presets:  # before any work: every preset with these settings must load
        check_measurable(load_config(name, (), deep_merge(parse_sets(bench_presets.CUT_SIZE), parse_sets(sets))))
    def log(line: str) -> None:
        console.print(line, markup=False, soft_wrap=True)

    results = [bench_presets.measure_preset(name, sets, log=log) for name in args.presets]
    table = Table(title="presets at a cut size")
    for col in bench_presets.COLUMNS:
        table.add_column(col)
    for row in bench_presets.rows(results):
        table.add_row(*row)
    console.print(table)
    for r in results:
        if not bench_presets.ok(r):
            console.print(f"[bench] {r['preset']} did not finish; the end of its output:\n{r['log_tail']}",
                          markup=False)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(bench_presets.markdown(results, sets, "python -m gspo_bench "
                                                              + shlex.join(args.argv), git_commit(), machine()))
        console.print(f"wrote {args.markdown}")
    return 0 if all(bench_presets.ok(r) for r in results) else 1


def memory_command(args, console) -> int:
    """``bench --memory``: each set of controls at each rollout size, each in its own process; a table, and
    Markdown with the command and commit; exit 1 unless every measurement finished."""
    import itertools
    import shlex
    from pathlib import Path

    from gspo_bench.bench import memory as bench_memory
    from gspo_bench.bench.throughput import check_measurable
    from gspo_bench.tracking.provenance import git_commit, machine

    controls = bench_memory.parse_controls(list(args.memory))
    commit = git_commit()  # the code that measures: read now, since a long measurement may outlive a commit
    given = args.prompts or [str(n) for n in bench_memory.DEFAULT_PROMPTS]
    try:
        sizes = [int(n) for n in given]
    except ValueError:
        raise ConfigError(f"--prompts {','.join(given)!r}: a comma list of prompt counts") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--prompts {','.join(given)!r}: each count must be >= 1")
    rounds = 1 if args.rounds is None else args.rounds
    if rounds < 1:
        raise ConfigError(f"--rounds {rounds}: must be >= 1")
    preset = args.preset or "default"
    sets = tuple(args.sets)
    for c in controls:  # before any work: every measurement's settings must load
        check_measurable(load_config(preset, (), parse_sets(list(bench_memory.child_overrides(sets, c, max(sizes))))))
    raw = []
    for k, size, c in itertools.product(range(rounds), sizes, controls):
        console.print(f"[bench] memory: controls {c}, {size} prompts"
                      + (f", round {k + 1} of {rounds}" if rounds > 1 else ""), markup=False)
        # a profile is taken in the first round only (each round would write the same file)
        r = bench_memory.measure(preset, sets, c, size, args.algo, profile_dir=args.profile if k == 0 else None)
        console.print("  " + (f"adds {r['added'] / 2**30:.2f} GiB (peak {r['peak'] / 2**30:.2f} GiB, "
                              f"{r['response_tokens']} response tokens, {r['seconds']:.1f} s)" if "added" in r else
                              "failed: " + bench_memory.failure_line(r["error"])), markup=False)
        if args.profile and k == 0 and "added" in r:
            console.print(f"  profile: {bench_memory.profile_path(args.profile, c, size)}", markup=False)
        raw.append(r)
    results = bench_memory.medians(raw) if rounds > 1 else raw
    group = load_config(preset, (), parse_sets(list(bench_memory.child_overrides(sets, "none", 1)))).rollout.group_size
    table = Table(title="memory one RL step adds" + (f" (medians of {rounds} rounds)" if rounds > 1 else ""))
    for col in bench_memory.COLUMNS:
        table.add_column(col)
    for row in bench_memory.rows(results, group):
        table.add_row(*row)
    console.print(table)
    for line in [*bench_memory.ratios(results), *bench_memory.time_ratios(raw)]:
        console.print(line, markup=False)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(bench_memory.markdown(results, group, "python -m gspo_bench "
                                                             + shlex.join(args.argv), commit, machine(), raw=raw))
        console.print(f"wrote {args.markdown}")
    return 0 if all("added" in r for r in raw) else 1


def suite_ray_command(args, console) -> int:
    """``bench --suite-ray``: the smoke suite serially and on Ray, timed; a table, JSON and Markdown with the
    command and commit; exit 1 unless every suite ended with every cell FINISHED."""
    import importlib.util
    import json
    import shlex
    from pathlib import Path

    from gspo_bench.bench import suite_ray
    from gspo_bench.bench.throughput import check_measurable
    from gspo_bench.tracking.provenance import git_commit, machine

    if args.workers is None:
        args.workers = SUITE_RAY_WORKERS
    if args.workers < 1 or args.repeats < 1:
        raise ConfigError(f"--workers {args.workers} and --repeats {args.repeats} must be >= 1")
    if args.preset or args.config or args.model or args.task:
        raise ConfigError("--suite-ray times the smoke suite as it ships (--set goes over it); --preset, --config, "
                          "--model and --task do not apply")
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("--suite-ray needs Ray: pip install '.[ray]'")
    check_measurable(load_config("smoke", (), parse_sets(args.sets)))  # before any work: the settings must load
    commit = git_commit()  # the code that measures, read before the minutes of measuring
    results = suite_ray.measure(args.workers, args.repeats, tuple(args.sets),
                                log=lambda line: console.print(line, markup=False, soft_wrap=True))
    table = Table(title=f"smoke suite: serial vs Ray with {args.workers} workers")
    for col in suite_ray.COLUMNS:
        table.add_column(col)
    for row in suite_ray.rows(results):
        table.add_row(*row)
    console.print(table)
    for r in [results["warm_up"], *results["runs"]["local"], *results["runs"]["ray"]]:
        if r["log_tail"]:
            console.print(f"[bench] a suite did not finish; the end of its output:\n{r['log_tail']}", markup=False)
    command = "python -m gspo_bench " + shlex.join(args.argv)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({**results, "command": command, "commit": commit}, indent=2))
        console.print(f"wrote {args.json}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(suite_ray.markdown(results, command, commit, machine()))
        console.print(f"wrote {args.markdown}")
    return 0 if suite_ray.ok(results) else 1


def warmstart_command(args, console) -> int:
    """``warmstart``: warm start (or load) each model x seed and show where greedy pass@1 lands."""
    import shlex
    from pathlib import Path

    from gspo_bench.tracking.runs import quiet
    from gspo_bench.train.runner import validate
    from gspo_bench.tracking.provenance import git_commit
    from gspo_bench.train.warmstart import band, band_markdown

    if args.seeds < 1:
        raise ConfigError(f"--seeds={args.seeds} must be >= 1")
    over = parse_sets(args.set)
    if args.task:
        over["task"] = args.task
    cfg = load_config(args.preset, tuple(args.config), over)
    models = args.model or [cfg.model.name]
    for m in models:  # every model name is checked before the first warm start
        validate(load_config(args.preset, tuple(args.config), {**over, "model": {"name": m}}))
    quiet()
    rows = band(cfg.task, models, list(range(args.seeds)), cfg.warmstart, progress=not args.no_progress,
                log=console.print, options=cfg.task_options)
    table = Table(title=f"warm-start band: {cfg.task}, target {cfg.warmstart.target_pass1:.0%}")
    for col in ("model", "seed", "greedy pass@1", "steps", "seconds", "cached"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.model, str(r.seed), f"{r.pass1:.1%}", str(r.steps), f"{r.seconds:.0f}", str(r.cached))
    console.print(table)
    for m in models:
        ps = [r.pass1 for r in rows if r.model == m]
        console.print(f"{m}: min {min(ps):.1%}, mean {sum(ps) / len(ps):.1%}, max {max(ps):.1%} over {len(ps)} seeds")
    if args.markdown:
        command = "python -m gspo_bench " + shlex.join(args.argv)
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(band_markdown(rows, cfg.warmstart, cfg.task, command, git_commit()))
        console.print(f"wrote {args.markdown}")
    return 0


def engines_command(args, console) -> int:
    """``bench --engines``: the engines side by side per model (``bench_engines``); tables, JSON, Markdown."""
    import json
    import shlex
    from pathlib import Path

    from gspo_bench.bench.engines import check_engines, markdown, run_engines_bench
    from gspo_bench.bench.throughput import check_measurable
    from gspo_bench.tracking.provenance import git_commit

    engines = tuple(args.engines)
    check_engines(engines)  # before any work: a bad name, or vllm missing, exits 2 at once
    if args.rl_steps < 0 or args.repeats < 1 or args.warmup < 0:
        raise ConfigError("--repeats must be >= 1, --warmup and --rl-steps >= 0")
    kernels = tuple(args.moe_kernels or ())
    if bad := [k for k in kernels if k not in MOE_KERNELS]:
        raise ConfigError(f"--moe-kernels: unknown kernel {bad[0]!r} (allowed: {', '.join(MOE_KERNELS)})")
    sets = parse_sets(args.sets)
    for model in args.model or [None]:  # every model found before any work
        check_measurable(load_config(args.preset or "cpu-bench", tuple(args.config), model_overrides(args, sets, model)))
    results = []
    for model in args.model or [None]:
        over = model_overrides(args, sets, model)
        console.print(f"[bold]bench --engines[/bold] {','.join(engines)} model={model or '(preset)'}")
        res = run_engines_bench(args.preset or "cpu-bench", tuple(args.config), over, engines, args.algo,
                                args.warmup, args.repeats, args.rl_steps, log=console.print,
                                moe_kernels=kernels).to_dict()
        table = Table(title=f"{res['model']}: rollout engines")
        for col in ("engine", "s", "tokens/s", "completions/s", "compile/start-up s", "sync s"):
            table.add_column(col)
        for name, g in res["generation"].items():
            if isinstance(g, dict):
                setup = g.get("compile_s", g.get("startup_s"))
                table.add_row(name, f"{g['seconds']:.3f}", f"{g['tokens_per_s']:.0f}", f"{g['completions_per_s']:.1f}",
                              "" if setup is None else f"{setup:.1f}",
                              "" if "weight_sync_s" not in g else f"{g['weight_sync_s']:.3f}")
        console.print(table)
        results.append(res)
    command = "python -m gspo_bench " + shlex.join(args.argv)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
        console.print(f"wrote {args.json}")
    if args.markdown:
        path = Path(args.markdown)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = markdown(results, command, git_commit())
        if args.append and path.exists():
            text = path.read_text().rstrip() + "\n\n" + text.split("\n", 2)[2]  # one title for the page
        path.write_text(text)
        console.print(f"wrote {args.markdown}")
    return 0
