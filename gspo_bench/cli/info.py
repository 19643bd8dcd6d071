"""The looking-up commands of the CLI: ``list`` (what exists), ``leaderboard`` (runs read back) and
``collapse-check`` (the detector on recorded runs).

``__main__`` parses the flags and hands the namespace over; these functions
do the work and print with the console they are given.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.table import Table
from rich.text import Text

from gspo_bench.config import presets


def preset_description(path: Path) -> str:
    """A preset's one-line description: the first sentence of its leading comment block."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _literal(*cells: str) -> list[Text]:
    """Table cells printed as written: rich would read ``[vllm]`` in ``pip install 'gspo-bench[vllm]'`` as markup
    and swallow it."""
    return [Text(str(c)) for c in cells]


def list_command(args, console) -> int:
    """``list``: algorithms and rollout engines (tables), advantage estimators, environments, tasks, models, and
    presets with their one-line descriptions."""
    from gspo_bench import algorithms
    from gspo_bench.core.advantages import ADVANTAGE_ESTIMATORS
    from gspo_bench.core.losses import LOSSES
    from gspo_bench.models import BUILTIN_MODELS
    from gspo_bench.rollout.engines import ENGINES
    from gspo_bench.tasks import ENVIRONMENTS, builtin_tasks, resolve_task_spec

    t = Table(title="algorithms")
    for col in ("name", "class", "ratio", "loss", "aggregation", "defaults (eps_low / eps_high; own)", "recipe"):
        t.add_column(col)
    for name in algorithms.names():
        s, cls = LOSSES[name], algorithms.get(name)
        recipe = ", ".join(f"{k}={v}" for k, v in vars(cls.recipe).items()
                           if v and k != "loss_defaults" and (k, v) != ("advantage_scale", "group")) or "-"
        t.add_row(*_literal(s.name, cls.__name__, s.ratio, s.loss, s.aggregation, s.defaults_text(), recipe))
    console.print(t)
    t = Table(title="rollout engines (rollout.engine; auto takes the first that fits, lowest auto first)")
    for col in ("name", "here", "free log-probs", "MoE routes", "devices", "model folder", "auto"):
        t.add_column(col)
    for name, cls in ENGINES.items():
        c, missing = cls.capabilities, cls.missing_reason()
        t.add_row(*_literal(name, "yes" if missing is None else f"no: {missing}", _yes(c.free_logp),
                            _yes(cls.routes_reason() is None), ", ".join(c.devices), _yes(c.needs_model_dir),
                            "-" if c.auto_order is None else str(c.auto_order)))
    console.print(t)
    from dataclasses import fields

    with_options = {n: cls.Options for n, cls in ENGINES.items() if getattr(cls, "Options", None) is not None}
    console.print("engine options (rollout.engine_options, e.g. --set 'rollout.engine_options={vllm: {kv_cache_mb: "
                  "512}}'): " + "; ".join(f"{n}: " + ", ".join(f"{f.name} (default {f.default})" for f in fields(o))
                                          for n, o in with_options.items()), soft_wrap=True, markup=False)
    def described(name: str) -> str:
        try:
            return f"{name} ({resolve_task_spec(name).description})"
        except ImportError as e:  # its verifier's optional extra is not installed: listed, with how to get it
            return f"{name} ({e})"

    console.print("advantage estimators (rollout.advantage_estimator): " + ", ".join(ADVANTAGE_ESTIMATORS),
                  soft_wrap=True, markup=False)
    console.print("environments (a rollout meets its task through one): " + ", ".join(
        f"{name} ({(env.__doc__ or '').strip().splitlines()[0].rstrip('.')})" if env.__doc__ else name
        for name, env in ENVIRONMENTS.items()), soft_wrap=True, markup=False)
    console.print("tasks:   " + ", ".join(described(n) for n in builtin_tasks()), soft_wrap=True, markup=False)
    console.print("models:  " + ", ".join(f"{m.name} ({m.description})" for m in BUILTIN_MODELS.values())
                  + ", or any local path / hub id of a causal LM", markup=False)
    console.print("presets (run --preset NAME; the stress scenarios are what `suite` runs):")
    for name, path in presets().items():
        console.print(f"  {name:<10} {preset_description(path)}", soft_wrap=True, markup=False)
    return 0


def collapse_check_command(args, console) -> int:
    """``collapse-check``: replay today's detector over recorded runs; optionally export their histories."""
    from gspo_bench.config import CollapseConfig, parse_sets
    from gspo_bench.reporting.collapse_check import from_mlflow, load, markdown, replay, save
    from gspo_bench.reporting.leaderboard import read_uri

    sets = parse_sets(args.sets)
    cfg = CollapseConfig(**sets.get("collapse", {}))
    if args.histories:
        pairs = load(args.histories)
    else:
        pairs = [(h, "") for h in from_mlflow(read_uri(args.tracking_uri), args.experiment)]
    rows = [(h, label, replay(h, cfg)) for h, label in pairs]
    console.print(markdown(rows), soft_wrap=True, markup=False)
    judged = [(label, bool(ev)) for _, label, ev in rows if label in ("collapsed", "healthy")]
    if judged:
        missed = sum(1 for lab, fired in judged if lab == "collapsed" and not fired)
        false_pos = sum(1 for lab, fired in judged if lab == "healthy" and fired)
        console.print(f"{sum(lab == 'collapsed' for lab, _ in judged)} runs judged collapsed, {missed} missed; "
                      f"{sum(lab == 'healthy' for lab, _ in judged)} judged healthy, {false_pos} false positives")
    if args.export:
        save([h for h, _, _ in rows], args.export, {h.name: label for h, label, _ in rows if label})
        console.print(f"histories -> {args.export}")
    return 0


def leaderboard_command(args, console) -> int:
    """``leaderboard``: the table, then the paired differences vs --baseline (an algorithm, or a split); with
    ``--fit``, the compute-scaling fits instead (``scaling_table.py``)."""
    from gspo_bench.config import ConfigError
    from gspo_bench.reporting.claim_specs import region_lookup
    from gspo_bench.reporting.grouping import check_by
    from gspo_bench.reporting.leaderboard import DEFAULT_BASELINE
    from gspo_bench.reporting.leaderboard import load_runs, no_runs_message, read_uri, rich_table, summarise
    from gspo_bench.reporting.paired_table import (check_baseline, paired_groups, paired_rich, render_paired,
                                                   render_with_paired)
    from gspo_bench.reporting.split_pairs import (check_split_value, parse_split_baseline, render_split_pairs,
                                                  render_with_split_pairs, split_pair_groups, split_pairs_rich)

    fit = getattr(args, "fit", None)
    if fit is not None and (args.paired or getattr(args, "target_mde", None) is not None):
        raise ConfigError("--fit prints the scaling fits instead of the tables; --paired and --target-mde ask for "
                          "other tables: give one")
    given = [flag for flag, v in (("--fit-x", getattr(args, "fit_x", None)),
                                  ("--fit-resamples", getattr(args, "fit_resamples", None)),
                                  ("--fit-split", getattr(args, "fit_split", None))) if v is not None]
    if fit is None and given:
        raise ConfigError(f"{', '.join(given)} set{'s' if len(given) == 1 else ''} the scaling fit: it goes with "
                          "--fit (e.g. --fit eval/pass1)")
    if args.runs:  # a results folder's raw data, no MLflow store
        from gspo_bench.reporting.frame import read_frames, runs_of, select

        runs = runs_of(select(read_frames(args.runs), args.experiment, args.task, args.model))
    else:
        from gspo_bench.reporting.leaderboard import LEADERBOARD_METRICS
        from gspo_bench.reporting.scaling_table import SCALING_HISTORIES

        metrics = LEADERBOARD_METRICS + ((fit, *SCALING_HISTORIES) if fit is not None else ())
        runs = load_runs(read_uri(args.tracking_uri), args.experiment, args.task, args.model, metrics)
    by = tuple(dict.fromkeys(args.by))  # --by: the tags splitting the groups, in order, once each
    rows = summarise(runs, by)
    if not rows:  # an empty leaderboard is a mistake (wrong experiment or filter), not a result
        raise ConfigError(no_runs_message(args.experiment, args.task, args.model))
    if by:
        check_by(runs, by)
    if fit is not None:  # the scaling fits instead of the tables
        from gspo_bench.reporting.scaling_table import check_metric, render_scaling, scaling_groups

        check_metric(runs, fit)
        from gspo_bench.reporting.scaling import N_BOOT, SPLIT
        from gspo_bench.reporting.scaling_table import AUTO

        groups = scaling_groups(runs, fit, args.fit_x or AUTO, by, N_BOOT if args.fit_resamples is None else
                                args.fit_resamples, SPLIT if args.fit_split is None else args.fit_split)
        fmt = "csv" if args.format == "csv" else "md"
        sys.stdout.write(render_scaling(groups, fmt))
        _say_set_aside(runs, fmt, console)
        return 0
    if split_base := parse_split_baseline(args.baseline, by):  # --baseline TAG=VALUE: splits vs a split
        check_split_value(runs, *split_base)
        sgroups = split_pair_groups(runs, *split_base, by, regions=region_lookup(args.experiment))
        fmt = args.format or ("table" if console.is_terminal else "md")
        if fmt == "table":
            board = [] if args.paired else [rich_table(rows, f"leaderboard: {args.experiment}")]
            for part in board + split_pairs_rich(sgroups):
                console.print(part)
        else:
            sys.stdout.write(render_split_pairs(sgroups, fmt) if args.paired else
                             render_with_split_pairs(rows, fmt, sgroups))
        _say_set_aside(runs, fmt, console)
        return 0
    baseline = args.baseline or DEFAULT_BASELINE
    target = getattr(args, "target_mde", None)
    if target is not None and not target > 0:
        raise ConfigError(f"--target-mde {target:g}: a difference to detect must be > 0 (points of pass@1, or steps)")
    # an explicit --baseline (or --paired or --target-mde, which ask for nothing else) must have a FINISHED run
    note = check_baseline(runs, baseline, strict=args.baseline is not None or args.paired or target is not None)
    groups = paired_groups(runs, baseline, by=by, regions=region_lookup(args.experiment))
    if target is not None:  # the seed planner instead of the tables
        from gspo_bench.reporting.planner import plan_rows, render_plan

        sys.stdout.write(render_plan(plan_rows(groups, target), target, "csv" if args.format == "csv" else "md"))
        return 0
    fmt = args.format or ("table" if console.is_terminal else "md")
    if fmt == "table":
        parts = [] if args.paired else [rich_table(rows, f"leaderboard: {args.experiment}")]
        for part in parts + paired_rich(groups, baseline, note):
            console.print(part)
    elif args.paired:
        sys.stdout.write(render_paired(groups, fmt, baseline, note))
    else:
        sys.stdout.write(render_with_paired(rows, fmt, groups, baseline, note))
    _say_set_aside(runs, fmt, console)
    return 0


def _say_set_aside(runs, fmt: str, console) -> None:
    """The line saying how many FINISHED runs the tables set aside (``frame.newest_counts``), if any: under the
    tables, or on stderr beside a CSV (which must stay one table)."""
    from gspo_bench.reporting.frame import set_aside
    from gspo_bench.reporting.leaderboard import predates_dev_split

    for line in (set_aside(runs), predates_dev_split(runs)):
        if line and fmt == "csv":
            sys.stderr.write(f"note: {line}\n")
        elif line:
            console.print(f"note: {line}", soft_wrap=True, markup=False)


def add_claims_parser(sub, default_uri: str) -> None:
    """The ``claims`` subcommand's flags (kept beside the command that reads them)."""
    from gspo_bench.reporting.claim_specs import DEFAULT_MARGIN, EXPERIMENTS

    c = sub.add_parser("claims", help="a verdict per claim of the sources (reproduced / refuted / not decided), "
                       "from the runs of the experiments that check them",
                       description="Reads the experiments " + ", ".join(EXPERIMENTS) + " (each from --tracking-uri "
                       "unless --source names another store), takes each claim's per-seed paired differences, their "
                       "95 %% t interval and MDE, and writes a Markdown page with one figure per claim: reproduced "
                       "when the interval lies inside the region the claim predicts, refuted when the test that it "
                       "lies outside rejects at its family's Holm level, not decided otherwise. An experiment that is missing leaves its claims 'not run'; a --runs table "
                       "holding none of the experiments is an error (exit 2).")
    c.add_argument("--tracking-uri", help=f"MLflow URI (default $MLFLOW_TRACKING_URI or {default_uri})")
    c.add_argument("--source", action="append", default=[], metavar="EXPERIMENT=URI",
                   help="read this experiment from another MLflow store (repeatable)")
    c.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"points of pass@1 treated as 'as well' / 'equal' (default {DEFAULT_MARGIN:g})")
    c.add_argument("--out", default="results/claims.md", help="the page to write; figures and the runs table "
                   "(runs.csv.gz, the page's raw data) go beside it in <stem>/ (default results/claims.md)")
    c.add_argument("--runs", metavar="FILE", action="append", help="read every experiment from a runs table "
                   "(an earlier claims page's <stem>/runs.csv.gz, or a report's runs.csv.gz) instead of MLflow "
                   "stores; repeatable: the tables are joined, an experiment's seeds from several (a later round's in "
                   "a new store), each seed from one, and the joined table is written beside the page as its raw "
                   "data")
    c.add_argument("--target-mde", type=float, metavar="X",
                   help="instead of the page: per decisive part, the seeds needed to detect X (in the part's unit: "
                   "points of pass@1, log10, or the metric) with 80 %% power at the level that decides it, from the "
                   "observed sd of its per-seed differences, with that sd's 95 %% interval")


def claims_command(args, console) -> int:
    """``claims``: evaluate every claim of ``claim_specs`` and write the page and its figures."""
    import shlex

    from gspo_bench.config import ConfigError
    from gspo_bench.paths import probe_writable_dir
    from gspo_bench.reporting import claims as cl
    from gspo_bench.reporting.claim_specs import EXPERIMENTS, claims
    from gspo_bench.reporting.leaderboard import read_uri

    if not args.margin > 0:
        raise ConfigError(f"--margin must be > 0, got {args.margin}")
    if args.target_mde is not None and not args.target_mde > 0:
        raise ConfigError(f"--target-mde {args.target_mde:g}: a difference to detect must be > 0")
    uris = {}
    if args.runs and args.source:
        raise ConfigError("--runs reads every experiment from the table; --source names MLflow stores: give one")
    for item in args.source:
        name, sep, uri = item.partition("=")
        if not sep or name not in EXPERIMENTS:
            raise ConfigError(f"--source {item!r}: expected EXPERIMENT=URI with EXPERIMENT one of "
                              f"{', '.join(EXPERIMENTS)}")
        uris[name] = read_uri(uri)
    specs = claims(args.margin)
    experiments = {e for c in specs for e in c.experiments}
    default, table = None, None
    if args.runs:
        from gspo_bench.reporting.frame import read_frame

        table = cl.join_tables({path: read_frame(path) for path in args.runs})
        cl.check_table(table, experiments, "--runs " + " ".join(repr(p) for p in args.runs))
    else:
        for name in EXPERIMENTS:
            if name not in uris:
                default = default or read_uri(args.tracking_uri)
                uris[name] = default
    out = Path(args.out)
    if args.target_mde is None:
        try:
            probe_writable_dir(out.parent, make=True)
        except OSError as e:
            raise ConfigError(f"--out {args.out!r}: {e.strerror or e}") from None
    runs, missing, frame = cl.load(uris, experiments, cl.needed_metrics(specs), table)
    results = cl.evaluate(specs, runs)
    if args.target_mde is not None:  # the seed planner: printed, no page written
        console.print(cl.render_plan(cl.plan_parts(results, args.target_mde), args.target_mde), soft_wrap=True,
                      markup=False)
        return 0
    fig_dir = out.parent / out.stem
    figures = {}
    for r in results:
        if any(p.stat.n for p in r.parts):
            path = cl.plot_claim(r, runs, fig_dir / f"claim-{r.claim.key}.png")
            figures[r.claim.key] = str(path.relative_to(out.parent))
    from gspo_bench.reporting.frame import set_aside
    from gspo_bench.reporting.leaderboard import predates_dev_split
    from gspo_bench.tracking.provenance import git_commit, machine

    meta = {"command": "python -m gspo_bench " + shlex.join(args.argv), "commit": git_commit(),
            "margin": args.margin, "machine": machine(), "missing": missing,
            "set_aside": set_aside([r for rs in runs.values() for r in rs]),
            "predates": predates_dev_split([r for rs in runs.values() for r in rs])}
    out.write_text(cl.markdown(results, meta, figures))
    from gspo_bench.reporting.frame import RUNS_FILE, write_frame

    # the page's raw data beside it (claims --runs reads it back), unless it was read from there: the runs of
    # the experiments the page read, from stores, several tables, or one table kept elsewhere
    own = fig_dir / RUNS_FILE
    if frame is not None and not _read_from(args.runs, own):
        write_frame(frame, own)
    for i, r in enumerate(results, 1):
        console.print(f"{i}. {r.claim.text} -> {r.verdict}{cl.seeds_and_mde(r)}", soft_wrap=True, markup=False)
    console.print(f"wrote {out} and {len(figures)} figures in {fig_dir}", soft_wrap=True, markup=False)
    return 0


def _read_from(runs: list[str] | None, own: Path) -> bool:
    """Whether a page read its runs from its own raw-data table alone (``--runs`` naming just that file), which
    it then leaves as it is; from stores, several tables, or one kept elsewhere, the page writes its own."""
    return bool(runs) and len(runs) == 1 and Path(runs[0]).resolve() == own.resolve()


def add_staleness_parser(sub, default_uri: str) -> None:
    """The ``staleness`` subcommand's flags."""
    from gspo_bench.reporting.claim_specs import DEFAULT_MARGIN

    c = sub.add_parser("staleness", help="the staleness grid's page: which loss and correction hold their score as "
                       "samples grow stale, and where each falls",
                       description="Reads the experiments staleness-e<eta>-<correction> (eta 0, 2, 4, 8; naive, tis, "
                       "m2po, is) from --tracking-uri or a --runs table and writes a Markdown page: final greedy "
                       "pass@1 per cell, each (correction, algorithm) at eta against itself on policy, paired by "
                       "seed (holds: the 95 %% interval above -margin; falls: below it; Holm over the page), the "
                       "collapse events, a figure, and the runs table (runs.csv.gz) beside it.")
    c.add_argument("--tracking-uri", help=f"MLflow URI (default $MLFLOW_TRACKING_URI or {default_uri})")
    c.add_argument("--runs", metavar="FILE", action="append", help="read the grid from a runs table (an earlier "
                   "page's runs.csv.gz) instead of an MLflow store; repeatable: the tables are joined, an "
                   "experiment's seeds from several (a later round's in a new store), each seed from one")
    c.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"points of pass@1 a cell may lose and still hold (default {DEFAULT_MARGIN:g})")
    c.add_argument("--out", default="results/staleness/README.md", help="the page to write; its figure and runs "
                   "table go beside it (default results/staleness/README.md)")
    c.add_argument("--run", action="store_true", help="first train the grid's cells into --tracking-uri, seed by "
                   "seed, skipping FINISHED runs and continuing stopped ones (the same command resumes; more "
                   "seeds are more --seeds), then write the page")
    c.add_argument("--seeds", default="0,1,2,3", metavar="S[,S...]", help="with --run: the seeds (default 0,1,2,3)")
    c.add_argument("--eta", default=None, metavar="E[,E...]", help="with --run: these etas only (default 0,2,4,8)")
    c.add_argument("--corrections", default=None, metavar="C[,C...]",
                   help="with --run: these corrections only (naive, tis, m2po, is; default all)")
    c.add_argument("--preset", default="default", help="with --run: the preset every cell starts from (default "
                   "default)")
    c.add_argument("--set", action="append", default=[], dest="sets", metavar="[SECTION.]FIELD=VALUE",
                   help="with --run: a config field over the preset for every cell, repeatable (the cell's own "
                   "lag and correction go over it)")


def staleness_command(args, console) -> int:
    """``staleness``: the staleness grid's page (``reporting/staleness.py``)."""
    import shlex

    from gspo_bench.config import ConfigError
    from gspo_bench.paths import probe_writable_dir
    from gspo_bench.reporting import claims as cl
    from gspo_bench.reporting import staleness as st
    from gspo_bench.reporting.frame import RUNS_FILE, read_frame, write_frame
    from gspo_bench.reporting.leaderboard import read_uri
    from gspo_bench.reporting.staleness_grid import cells, experiment
    from gspo_bench.tracking.provenance import git_commit, machine

    if not args.margin > 0:
        raise ConfigError(f"--margin must be > 0, got {args.margin}")
    if args.run:
        if args.runs:
            raise ConfigError("--run trains into --tracking-uri; --runs reads a table: give one")
        ran = _run_staleness_grid(args, console)
        if ran.get("FINISHED", 0) == 0:
            raise ConfigError("staleness --run: no run FINISHED; see the lines above")
    elif args.sets or args.eta or args.corrections or args.seeds != "0,1,2,3":
        raise ConfigError("--seeds, --eta, --corrections and --set choose what --run trains: add --run")
    names = {experiment(eta, c) for eta, c in cells()}
    table, uris = None, None
    if args.runs:
        table = cl.join_tables({path: read_frame(path) for path in args.runs})
        cl.check_table(table, names, "--runs " + " ".join(repr(p) for p in args.runs))
    else:
        uri = read_uri(args.tracking_uri)
        uris = {n: uri for n in names}
    out = Path(args.out)
    try:
        probe_writable_dir(out.parent, make=True)
    except OSError as e:
        raise ConfigError(f"--out {args.out!r}: {e.strerror or e}") from None
    runs, missing, frame = cl.load(uris, names, frame=table)
    if len(missing) == len(names):
        raise ConfigError("no experiment of the staleness grid was found: " + "; ".join(sorted(missing.values())[:2]))
    grid = st.collect(runs)
    rows = st.grid_rows(grid, args.margin)
    figure = st.plot_grid(grid, out.parent / "staleness.png")
    meta = {"command": "python -m gspo_bench " + shlex.join(args.argv), "commit": git_commit(), "margin": args.margin,
            "machine": machine(), "runs": st.provenance(runs)}
    out.write_text(st.markdown(grid, rows, meta, str(figure.relative_to(out.parent))))
    own = out.parent / RUNS_FILE
    if frame is not None and not _read_from(args.runs, own):
        write_frame(frame, own)
    for line in st.summary_lines(rows):
        console.print(line, soft_wrap=True, markup=False)
    console.print(f"wrote {out}, {figure} and {own}", soft_wrap=True, markup=False)
    return 0


def _run_staleness_grid(args, console) -> dict[str, int]:
    """``staleness --run``: every asked-for cell's config built and checked, then trained (``suite/staleness.py``)."""
    from gspo_bench.config import ConfigError, parse_sets, resolve_tracking_uri
    from gspo_bench.reporting.staleness_grid import CORRECTIONS, ETAS
    from gspo_bench.suite import staleness as grid
    from gspo_bench.train.runner import validate

    def items(flag: str, text: str | None, allowed, cast=str) -> tuple:
        if text is None:
            return tuple(allowed)
        try:
            got = tuple(cast(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            got = ()
        if not got or any(x not in allowed for x in got) or len(set(got)) < len(got):
            raise ConfigError(f"{flag} {text}: expected distinct values among {', '.join(map(str, allowed))}")
        return got

    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) < len(seeds) or min(seeds) < 0:
        raise ConfigError(f"--seeds {args.seeds}: expected distinct whole numbers >= 0, comma-separated")
    uri = resolve_tracking_uri(args.tracking_uri)
    cells = grid.grid_cells(seeds, uri, args.preset, parse_sets(args.sets),
                            items("--eta", args.eta, ETAS, int), items("--corrections", args.corrections, CORRECTIONS))
    for cell in cells:  # everything cheap to check, for every cell, before the first trains
        validate(cell.cfg)
    log = lambda m: console.print(m, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    counts = grid.run_grid(cells, log=log)
    log("staleness --run: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    args.tracking_uri = uri
    return counts


def add_variance_parser(sub) -> None:
    """The ``variance`` subcommand's flags."""
    from gspo_bench.reporting.leaderboard import DEFAULT_BASELINE

    c = sub.add_parser("variance", help="where the spread between seeds comes from: warm start, training, "
                       "evaluation (from runs tables)",
                       description="Reads runs tables (a report's runs.csv.gz) whose seeds were run with more than "
                       "one RL draw (train.rl_seed) and whose final evaluations logged the two halves of the eval "
                       "set, and writes a page: each algorithm's lift per seed, and the variance of each lift and "
                       "of each paired difference against --baseline split into seed, training and evaluation "
                       "parts, with the eval size that would bring the evaluation's part to a quarter.")
    c.add_argument("--runs", metavar="FILE", action="append", required=True,
                   help="a runs table (repeatable: the tables are joined; a run in two of them is an error)")
    c.add_argument("--baseline", default=DEFAULT_BASELINE,
                   help=f"the algorithm the paired differences are taken against (default {DEFAULT_BASELINE})")
    c.add_argument("--title", default="Where the spread between seeds comes from", help="the page's title")
    c.add_argument("--out", default="results/variance.md", help="the page to write (default results/variance.md)")


def variance_command(args, console) -> int:
    """``variance``: the per-seed lifts and the variance split of ``reporting/variance.py``."""
    import shlex

    from gspo_bench.config import ConfigError
    from gspo_bench.paths import probe_writable_dir
    from gspo_bench.reporting import variance as va
    from gspo_bench.reporting.frame import read_frames, runs_of
    from gspo_bench.tracking.provenance import git_commit, machine

    runs = runs_of(read_frames(args.runs))
    ds = va.draws(runs)
    if not ds:
        raise ConfigError("--runs: no FINISHED run with a step-0 and a final eval/pass1 in " + " ".join(args.runs))
    if args.baseline not in {d.algo for d in ds}:
        raise ConfigError(f"--baseline {args.baseline!r}: no FINISHED run of it in the tables (algorithms: "
                          f"{', '.join(sorted({d.algo for d in ds}))})")
    prompts = {r.params.get("train.eval_prompts") for r in runs if r.status == "FINISHED"}
    if len(prompts) != 1 or not str(next(iter(prompts))).isdigit():
        raise ConfigError(f"--runs: the runs differ in train.eval_prompts ({', '.join(map(str, prompts))}): "
                          "give runs of one evaluation size")
    out = Path(args.out)
    try:
        probe_writable_dir(out.parent, make=True)
    except OSError as e:
        raise ConfigError(f"--out {args.out!r}: {e.strerror or e}") from None
    meta = {"title": args.title, "command": "python -m gspo_bench " + shlex.join(args.argv), "commit": git_commit(),
            "machine": machine()}
    out.write_text(va.markdown(ds, args.baseline, int(next(iter(prompts))), meta))
    console.print(f"wrote {out} ({len(ds)} runs)", soft_wrap=True, markup=False)
    return 0
