"""The looking-up commands of the CLI: ``list`` (what exists) and ``collapse-check`` (the detector on recorded runs).

``__main__`` parses the flags and hands the namespace over; these functions
do the work and print with the console they are given.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

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


def list_command(args, console) -> int:
    """``list``: algorithms (a table), tasks, models, and presets with their one-line descriptions."""
    from gspo_bench import algorithms
    from gspo_bench.losses import LOSSES
    from gspo_bench.models import BUILTIN_MODELS
    from gspo_bench.tasks import builtin_tasks, resolve_task_spec

    t = Table(title="algorithms")
    for col in ("name", "class", "ratio", "loss", "aggregation", "clip (eps_low / eps_high)", "recipe"):
        t.add_column(col)
    for name in algorithms.names():
        s, cls = LOSSES[name], algorithms.get(name)
        recipe = ", ".join(f"{k}={v}" for k, v in vars(cls.recipe).items() if v) or "-"
        t.add_row(s.name, cls.__name__, s.ratio, s.loss, s.aggregation, f"{s.eps_low} / {s.eps_high}", recipe)
    console.print(t)
    console.print("tasks:   " + ", ".join(f"{n} ({resolve_task_spec(n).description})" for n in builtin_tasks()))
    console.print("models:  " + ", ".join(f"{m.name} ({m.description})" for m in BUILTIN_MODELS.values())
                  + ", or any local path / hub id of a causal LM")
    console.print("presets (run --preset NAME; the stress scenarios are what `suite` runs):")
    for name, path in presets().items():
        console.print(f"  {name:<10} {preset_description(path)}", soft_wrap=True)
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
