"""``report``: ``report.md`` and its figures for one experiment, also logged to MLflow.

Per leaderboard group (task, model, preset, config) of FINISHED runs:

(a) eval pass@1 and eval reward mean vs step, with (e) collapse events marked;
(b) clip/frac vs step on a log axis, and the measured GSPO/GRPO clip ratio
    next to the article's claim (~15 % vs ~0.13 %, about 100x);
    (a), (b) and (d) with more than ``figures.OVERLAY_MAX`` algorithms: a
    panel per algorithm, the baseline's mean curve grey in each;
(c) token vs sequence ratio histograms for the last ``ratios/step_*.json``
    batch of a gspo run (gspo_token when there is none), clip band marked;
(d) the MoE expert flip rate, for groups with ``moe=true`` runs;
(f) the paired differences vs the baseline (``--baseline``, default grpo):
    the leaderboard's paired table and MDE line for the group, and a forest
    plot of each algorithm's mean final pass@1 difference with its 95 %
    interval, sorted by mean;
(g) with ``by`` only, once per group after its splits' sections ("Splits
    compared", ``splits_<group>.png``): eval pass@1, mismatch/kl,
    moe/routing_mismatch and moe/expert_flip_rate (those logged) vs step, a
    panel per metric and algorithm, a line per split (mean over seeds,
    min–max band), and a table of each split's seeds, final pass@1 and mean
    mismatch;
(h) compute scaling, in each group's section after (f): each algorithm's
    evaluations against the rollout compute (log axis) with its pooled
    ScaleRL fit, and the fits' table (A, B, C_mid with bootstrap intervals
    over seeds, or "not identified" at a bound; RMS; the final evaluation
    predicted from the first half, beside a straight line in log compute)
    for eval/pass1 and every eval/mean_at_<k> logged (``scaling_table.py``).

Missing data skips a figure with a sentence saying why. The files are logged
as artifacts of a new run named ``report`` tagged ``kind=report``, which the
leaderboard never reads.

With ``by`` (``report --by TAG[,TAG...]``, see ``grouping.py``) each group
is split further by those run tags' values: a section per split, its
figure file names carrying the values (``eval_arith_tiny-dense_routing-replay-r3.png``),
and the paired differences taken within the split; then (g) compares the
group's splits with each other. With ``--baseline TAG=VALUE`` (TAG one of the
``by`` tags; ``split_pairs.py``) (g) also holds the paired differences of
each algorithm's splits vs its split with TAG=VALUE (the other tags equal),
same seed against same seed; the per-split (f) sections then stay against
the default baseline algorithm.

With ``storage`` (``report --storage URL [--study NAME ...]``) the report
gains a section per Optuna study: its trial history and parameter
importances (``reporting/study.py``).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gspo_bench import tables
from gspo_bench.reporting import figures
from gspo_bench.reporting.claim_specs import region_lookup
from gspo_bench.config import ConfigError
from gspo_bench.paths import probe_writable_dir
from gspo_bench.tracking import client as tracking_client
from gspo_bench.tracking import stores
from gspo_bench.tracking.client import run_lifetime, start_run
from gspo_bench.tracking.redact import redact
from gspo_bench.tracking.ui import mark_experiment
from gspo_bench.reporting.grouping import MISSING, by_slug, check_by, split_values
from gspo_bench.reporting.frame import (FINISHED, RUNS_FILE, RunData, experiment_id, load_frame, read_frames, runs_of,
                                        mixed_warm_starts, select, set_aside, write_frame)
from gspo_bench.reporting.leaderboard import (DEFAULT_BASELINE, DEFAULT_EXPERIMENT, NOTES, no_runs_message, render,
                                              slug, summarise)
from gspo_bench.reporting.paired import seed_key
from gspo_bench.reporting.paired_table import PairedGroup, check_baseline, paired_groups, render_paired
from gspo_bench.reporting.pairing import group_title
from gspo_bench.reporting.scaling_table import (AUTO, MEAN_AT, NOTES as SCALING_NOTES, SCALING_HISTORIES,
                                                ScalingGroup, axis_text, fit_metrics, group_markdown, scaling_groups)
from gspo_bench.reporting.split_pairs import (check_split_value, parse_split_baseline, split_pair_groups,
                                              split_pairs_section)

REPORT_METRICS = ("eval/pass1", "eval/reward_mean", "clip/frac", "reward/mean", "moe/expert_flip_rate",
                  "mismatch/kl", "moe/routing_mismatch", f"{MEAN_AT}*", *SCALING_HISTORIES)
RATIO_ALGOS = ("gspo", "gspo_token")  # whose ratios/step_*.json figure (c) draws, in order of preference
# the settings every run of a comparison should share: (label, param keys tried in order)
CONFIG_KEYS = (
    ("preset", ("preset",)), ("task", ("task",)), ("model", ("model.name",)), ("RL steps", ("train.steps",)),
    ("prompts per step", ("resolved.rollout.prompts_per_step", "rollout.prompts_per_step")),
    ("group size", ("resolved.rollout.group_size", "rollout.group_size")),
    ("minibatches per rollout", ("train.minibatches",)), ("learning rate", ("train.lr",)),
    ("max new tokens", ("resolved.rollout.max_new_tokens", "rollout.max_new_tokens")),
    ("temperature", ("resolved.rollout.temperature", "rollout.temperature")),
    ("eval every (steps)", ("train.eval_every",)), ("eval prompts", ("train.eval_prompts",)),
    ("eval samples (reward mean)", ("train.eval_samples",)), ("warm start pass@1", ("resolved.warmstart.pass1",)),
)


@dataclass
class Report:
    path: Path  # report.md
    figures: list[Path] = field(default_factory=list)
    run_id: str | None = None  # the MLflow run holding them


def _distinct(runs: list[RunData], get) -> list[str]:
    return sorted({v for v in map(get, runs) if v})


def _join(values: list[str], missing: str) -> str:
    return ", ".join(f"`{v}`" for v in values) if values else missing


def config_table(runs: list[RunData]) -> list[str]:
    rows = []
    for label, keys in CONFIG_KEYS:
        vals = _distinct(runs, lambda r: next((r.params[k] for k in keys if k in r.params), None))
        rows.append([label, " / ".join(vals) + (" (differs between runs)" if len(vals) > 1 else "") if vals else "-"])
    return tables.markdown(("setting", "value"), rows).rstrip("\n").split("\n")


def _artifact_json(client, run: RunData, path: str):
    """A JSON artifact of ``run``, None when it is absent or unreadable (``tracking.client.artifact_json``)."""
    return tracking_client.artifact_json(client, run.artifact_uri, path)


def collapse_events(client, run: RunData) -> list[dict]:
    """Events from ``collapse_events.json`` when the run wrote it (and the store is at hand: ``client``), else
    (kind, step) from the metrics."""
    if client is not None and (run.tags.get("collapse.count", "0") not in ("", "0") or run.collapse_steps()):
        data = _artifact_json(client, run, "collapse_events.json")
        if data:
            return sorted(data, key=lambda e: e.get("step", 0))
    return [{"kind": k, "step": s} for k, s in run.collapse_steps()]


def ratio_payload(client, runs: list[RunData]) -> dict | None:
    """The last ``ratios/step_*.json`` of the group's first gspo (else gspo_token) run that has one (None
    without the store: a runs table holds no artifacts)."""
    if client is None:
        return None
    for algo in RATIO_ALGOS:
        for r in sorted((r for r in runs if r.algo == algo), key=lambda r: r.seed):
            try:
                files = [a.path for a in client.list_artifacts(r.run_id, "ratios") if a.path.endswith(".json")]
            except Exception:
                files = []
            if files:
                last = max(files, key=lambda f: int(re.sub(r"\D", "", Path(f).stem) or -1))
                payload = _artifact_json(client, r, last)
                if payload:
                    return {**payload, "seed": r.seed}
    return None


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:#.3g} %"


def clip_claim(rows: list[dict]) -> str:
    clip = {r["algo"]: r.get("clip_frac") for r in rows if r["status"] == FINISHED}
    gspo, grpo = clip.get("gspo"), clip.get("grpo")
    claim = "The GSPO article reports GSPO clipping about 100x more tokens than GRPO (~15 % vs ~0.13 %)."
    if gspo is None or grpo is None:
        return f"{claim} Not measured here: the group lacks a finished gspo or grpo run."
    ratio = f"{gspo / grpo:.1f}x" if grpo > 0 else "undefined (GRPO clipped nothing)"
    return (f"{claim} Measured here (mean clip/frac over steps, then seeds): GSPO {_pct(gspo)}, "
            f"GRPO {_pct(grpo)}, ratio {ratio}.")


def paired_section(paired: PairedGroup | None, baseline: str, note: str | None, title: str, name: str,
                   out: Path) -> tuple[list[str], list[Path]]:
    """(f): the group's paired table and MDE line, and its figure when some algorithm has a pair."""
    md = [f"### (f) Paired differences vs {baseline}", ""]
    if note or paired is None:
        return md + [f"Skipped: {note or f'no FINISHED {baseline} run in this group'}.", ""], []
    md += [f"Per seed s, d_s = metric(algo, s) - metric({baseline}, s) over the seeds where both finished (same "
           "warm start and prompt order); steps to +10 pts only over the seeds where both reached it. Mean, 95 % "
           "t interval; significant = the interval excludes 0, each comparison on its own; p = the paired t test; "
           "Holm p = that p adjusted by Holm's method over the group's algorithms, one family per metric: below "
           "0.05, the difference is decided within that metric's family (the table's three metrics are three "
           "families). MDE (Holm): the difference decided with 80 % power at Holm's first step, 0.05 / k over the "
           "k algorithms with a p. A tie (every seed's difference equal): n/a. pass@1 differences in points "
           "(100 x pass@1).", ""]
    if paired.note:
        return md + [f"No pairs: {paired.note}.", ""], []
    md += [render_paired([paired], "md", baseline, with_title=False).rstrip("\n"), ""]
    drawable = [r for r in paired.rows if r["metric"] == "final_pass1" and r["n"] > 0]
    if not drawable:
        return md + ["No figure: no algorithm has a seed paired with the baseline on final pass@1.", ""], []
    fig = figures.plot_paired(paired, out / f"paired_{name}.png", title)
    md += [f"![paired differences in final pass@1 vs {baseline}, {title}]({fig.name})", "",
           "Forest plot: a row per algorithm, largest mean paired difference in final pass@1 on top; line = 95 % t "
           "interval, filled marker and bold label = decided (Holm p < 0.05 over the group's algorithms; an interval "
           "that excludes 0 on its own is not enough), hollow = undecided, "
           "hollow with no line = one pair (no interval); mean [low, high] in points on the right"
           + ("; shaded: ± the group's MDE, the difference this design detects with 80 % power." if paired.mde
              is not None else "."), ""]
    return md, [fig]


def group_section(client, key: tuple, runs: list[RunData], rows: list[dict], out: Path,
                  paired: PairedGroup | None = None, baseline: str = DEFAULT_BASELINE,
                  paired_note: str | None = None, by: tuple[str, ...] = (),
                  scaling: list[ScalingGroup] | None = None) -> tuple[list[str], list[Path]]:
    """The section of one group (``key`` = task, model, preset, config, then the values of the ``by`` tags);
    ``scaling``: the group's compute-scaling fits, one per fitted metric."""
    task, model, preset, config, *vals = key
    title = group_title(key, by)
    name = slug(task, model, *(p for p in (preset, config) if p != "default"), *by_slug(by, tuple(vals)))
    split = "".join(f", {n} `{v}`" for n, v in zip(by, vals))
    md = [f"## {title}", "", f"Preset `{preset}`, config `{config}`{split}; {len(runs)} finished runs "
          f"({', '.join(f'{a} ×{len(v)}' for a, v in figures.by_algo(runs).items())}).", ""]
    figs = [figures.plot_eval(runs, out / f"eval_{name}.png", title, baseline),
            figures.plot_clip(runs, out / f"clip_{name}.png", title, baseline)]
    many = len(figures.by_algo(runs)) > figures.OVERLAY_MAX
    reference = figures.reference_algo(list(figures.by_algo(runs)), baseline)
    panels = (f" More than {figures.OVERLAY_MAX} algorithms: a panel per algorithm on shared axes, {reference}'s "
              "mean curve repeated in every panel as a thin grey line." if many else "")
    md += [f"### (a) Evaluation", "", f"![eval pass@1 and reward, {title}]({figs[0].name})", "",
           "Mean over seeds with a min–max band; X markers are collapse events, at the event's step on the "
           "algorithm's mean pass@1 curve, labelled with kind and seed." + panels
           + (" Eval pass@1 in the upper block of panels, eval reward mean in the lower." if many else ""), "",
           "### (b) Clipped-token fraction", "", f"![clip/frac, {title}]({figs[1].name})", "",
           f"Log scale: steps with no clipped token are drawn at {figures.CLIP_FLOOR:g}; dotted: the article's "
           f"levels.{panels} {clip_claim(rows)}", ""]
    md += ["### (c) Token vs sequence ratios", ""]
    payload = ratio_payload(client, runs)
    if payload is None and client is None:
        md += ["Skipped: read from a runs table, which holds metrics, not the runs' artifacts; the histogram needs "
               "a GSPO run's `ratios/step_*.json` from the MLflow store.", ""]
    elif payload is None:
        md += ["Skipped: no finished gspo (or gspo_token) run in this group has a `ratios/step_*.json` "
               "artifact (runs older than that artifact, or no GSPO run).", ""]
    else:
        figs.append(figures.plot_ratios(payload, out / f"ratios_{name}.png", title))
        md += [f"![ratios, {title}]({figs[-1].name})", "",
               f"One batch: {payload.get('algo')} seed {payload['seed']}, step {payload.get('step')} (the last "
               f"logged). r = exp(token_log_ratio), s_i = exp(seq_log_ratio); shaded: GSPO's clip band "
               f"[1 - eps_low, 1 + eps_high] with eps_low={payload.get('eps_low')}, "
               f"eps_high={payload.get('eps_high')}. Density on a log axis.", ""]
    md += ["### (d) MoE expert flip rate", ""]
    moe = [r for r in runs if r.tags.get("moe") == "true"]
    if moe and any("moe/expert_flip_rate" in r.history for r in moe):
        figs.append(figures.plot_moe(moe, out / f"moe_{name}.png", title, baseline))
        md += [f"![expert flip rate, {title}]({figs[-1].name})", "",
               "Fraction of the old policy's (token, layer, top-k slot) expert choices that the updated policy "
               "no longer makes, per RL step."
               + (" A panel per algorithm, the reference's mean curve in grey in each." if len(figures.by_algo(moe))
                  > figures.OVERLAY_MAX else ""), ""]
    else:
        md += ["Skipped: no MoE run (tag `moe=true`) with `moe/expert_flip_rate` in this group.", ""]
    md += ["### (e) Collapse events", ""]
    md += collapse_table([(r, e) for r in runs for e in collapse_events(client, r)])
    pmd, pfigs = paired_section(paired, baseline, paired_note, title, name, out)
    smd, sfigs = scaling_section(scaling or [], title, name, out)
    return md + pmd + smd, figs + pfigs + sfigs


def collapse_table(events: list[tuple[RunData, dict]]) -> list[str]:
    """(e)'s lines: one row per (run, event). With the detector's values (its artifact, read from the store) the
    value, threshold and detail columns; from a runs table only the kinds and steps its metrics hold, and a note."""
    if not events:
        return ["none", ""]

    def val(e: dict, k: str) -> str:
        return f"{e[k]:.4g}" if isinstance(e.get(k), (int, float)) else "-"

    ordered = sorted(events, key=lambda x: (x[0].algo, x[0].seed, x[1].get("step", 0)))
    if any("value" in e or "detail" in e for _, e in events):
        return [tables.markdown(("algo", "seed", "kind", "step", "value", "threshold", "detail"),
                                [[r.algo, r.seed, e.get("kind"), e.get("step"), val(e, "value"), val(e, "threshold"),
                                  e.get("detail", "-")] for r, e in ordered]), ""]
    return [tables.markdown(("algo", "seed", "kind", "step"),
                            [[r.algo, r.seed, e.get("kind"), e.get("step")] for r, e in ordered]), "",
            "Value, threshold and detail of each event are in its run's `collapse_events.json` artifact, which a "
            "runs table does not hold.", ""]

def scaling_section(groups: list[ScalingGroup], title: str, name: str, out: Path) -> tuple[list[str], list[Path]]:
    """(h): the figure of the group's first fitted metric (eval/pass1) and a table per fitted metric."""
    md = ["### (h) Compute scaling", ""]
    groups = [g for g in groups if g.algos]
    if not groups:
        return md + ["Skipped: no finished run of this group has an eval history and the rollout settings "
                     "(prompts per step, group size) that place it on a compute axis.", ""], []
    first, figs = groups[0], []
    if any(a.fit.pooled is not None for a in first.algos):
        figs.append(figures.plot_scaling(first, out / f"scaling_{name}.png", title))
        md += [f"![{first.metric} against rollout compute, {title}]({figs[0].name})", "",
               f"{first.metric} against the rollout compute ({axis_text(first)}), log axis: faint dots = each "
               "seed's evaluations, markers = their mean per evaluation step, line = the pooled fit "
               "R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) (dotted past the last evaluation), dashed = its "
               "asymptote A, grey dash-dot = the warm start R0 (step 0, not on a log axis).", ""]
    else:
        md += [f"No figure: no algorithm's {first.metric} has as many compute points (evaluation steps with "
               "C > 0) as the curve has parameters.", ""]
    for g in groups:
        md += [f"**{g.metric}** against {axis_text(g)}", "", group_markdown(g).rstrip("\n"), ""]
    return md + [SCALING_NOTES, ""], figs


def _cell(xs: list[float], fmt: str) -> str:
    return f"{statistics.fmean(xs):{fmt}}" if xs else "-"


def _run_mean(history: list[tuple[int, float]]) -> float | None:
    """A run's mean of a metric over the steps it logged (finite values only); None when there are none."""
    xs = [v for _, v in history if math.isfinite(v)]
    return statistics.fmean(xs) if xs else None


def splits_section(key: tuple, splits: dict[tuple, list[RunData]], by: tuple[str, ...],
                   out: Path) -> tuple[list[str], list[Path]]:
    """(g): the splits of the group ``key`` (task, model, preset, config) compared: ``splits`` maps each
    split's ``by`` values to its FINISHED runs."""
    title = group_title(key, ())
    task, model, preset, config = key
    name = slug(task, model, *(p for p in (preset, config) if p != "default"))
    md = [f"## Splits compared: {title}", ""]
    label = lambda vals: ", ".join(f"{t}={v}" for t, v in zip(by, vals))  # noqa: E731
    runs = [r for rs in splits.values() for r in rs]
    metrics = [m for m, *_ in figures.SPLIT_METRICS if any(r.history.get(m) for r in runs)]  # logged by some run
    figs = []
    if not metrics:
        md += [f"No figure: no run of the group logged {', '.join(f'`{m}`' for m, *_ in figures.SPLIT_METRICS)}.",
               ""]
    else:
        figs.append(figures.plot_splits({label(v): rs for v, rs in splits.items()}, metrics,
                                        out / f"splits_{name}.png", title))
        ns = sorted({len(rs) for algo_rs in splits.values() for rs in figures.by_algo(algo_rs).values()})
        n = (f"{ns[0]}" if len(ns) == 1 else f"{ns[0]} to {ns[-1]}") + " seeds per line" + (
            "" if len(ns) == 1 else " (each line's n: the seeds column below)")
        absent = [f"`{m}`" for m, *_ in figures.SPLIT_METRICS if m not in metrics]
        md += [f"![splits compared, {title}]({figs[0].name})", "",
               f"A row per metric ({', '.join(f'`{m}`' for m in metrics)}), a column per algorithm, a line per "
               f"split ({', '.join(by)}): the mean over the split's seeds at each step, shaded band = min..max over "
               f"those seeds; n = {n}. `mismatch/kl` on a log axis, values <= 0 left out."
               + (f" Not logged by any run of the group: {', '.join(absent)}." if absent else ""), ""]
    cells = []
    for algo in figures.by_algo(runs):
        for vals, rs in splits.items():
            mine = [r for r in rs if r.algo == algo]
            if not mine:
                continue
            seeds = sorted({r.seed for r in mine}, key=seed_key)
            # final pass@1 of a run = its last eval/pass1 value; mean ± sample sd over the split's seeds
            final = [h[-1][1] for r in mine if (h := r.history.get("eval/pass1"))]
            pass1 = "-" if not final else f"{statistics.fmean(final):.3f}" + (
                f" ± {statistics.stdev(final):.3f}" if len(final) > 1 else "")
            # mismatch: each run's mean over its steps, then the mean over the seeds that logged it
            mean = {m: [x for r in mine if (x := _run_mean(r.history.get(m, []))) is not None]
                    for m in ("mismatch/kl", "moe/routing_mismatch")}
            cells.append([algo, *vals, f"{len(seeds)} ({','.join(seeds)})", pass1, _cell(mean["mismatch/kl"], ".3g"),
                          _cell(mean["moe/routing_mismatch"], ".3g")])
    md += [tables.markdown(("algo", *by, "seeds", "final pass@1", "mean mismatch/kl", "mean routing mismatch"),
                           cells)]
    md += [f"final pass@1 = the last eval/pass1 of each seed, mean ± sd over seeds; the two mismatch columns: "
           "mean over steps per seed, then over seeds (`-`: not logged)"
           + (f"; `{MISSING}` as a split value: runs without the tag." if any(MISSING in v for v in splits) else "."),
           ""]
    return md, figs


def write_report(uri: str, experiment: str = DEFAULT_EXPERIMENT, out: str | Path | None = None,
                 task: str | None = None, model: str | None = None, command: str = "",
                 log_to_mlflow: bool = True, storage: str | None = None, studies: list[str] | None = None,
                 baseline: str = DEFAULT_BASELINE, strict_baseline: bool = False, by: tuple[str, ...] = (),
                 runs_file: str | list[str] | None = None) -> Report:
    """Write ``out/report.md``, its PNGs and the runs it read (``out/runs.csv.gz``, ``frame.write_frame``); log
    them to a ``kind=report`` MLflow run unless told not to. A store that would refuse that run (read only, an
    artifact folder that takes no files: ``stores.writable_uri``, ``stores.check_store``) is a ConfigError before
    anything is written.

    ``runs_file``: read the runs from such a table, or from several joined (``frame.read_frames``), instead of
    ``uri`` (then ``uri`` is None, nothing is logged to MLflow, and what only artifacts hold is left out:
    collapse events come from their metrics, the ratio histogram is skipped).

    ``storage``: also a section per Optuna study in it (``studies``, default all); then an experiment
    holding only tuning trials is not an error. ``baseline``: of the paired differences; with
    ``strict_baseline`` (an explicit ``--baseline``) one without a FINISHED run is a ConfigError, else
    the paired sections say they are skipped. ``by``: run tags splitting every group further (a tag no run
    has is a ConfigError). ``baseline`` may also be ``TAG=VALUE`` with TAG in ``by`` (``split_pairs.py``):
    then (g) also gets the paired differences of each split vs its TAG=VALUE split, and (f) stays vs the
    default baseline algorithm, not strict.
    """
    files = [] if runs_file is None else [runs_file] if isinstance(runs_file, (str, Path)) else list(runs_file)
    if files:
        frame = select(read_frames(files), experiment, task, model)
        log_to_mlflow = False
    else:
        frame = load_frame(uri, experiment, task, model, REPORT_METRICS)
    runs = runs_of(frame)
    if not runs and storage is None:
        raise ConfigError(no_runs_message(experiment, task, model))
    if log_to_mlflow:  # the report's own run comes last: a store that would refuse it is refused before any page
        try:
            stores.check_store(stores.writable_uri(uri), experiment)
        except ConfigError as e:
            raise ConfigError(f"{e}; report logs its own run there (kind=report)") from None
    # before anything is written: a bad --baseline is a one-line error
    split_base = parse_split_baseline(baseline, by)  # TAG=VALUE: splits vs a split, in (g); (f) vs the default
    if split_base:
        baseline, strict_baseline = DEFAULT_BASELINE, False
    paired_note = check_baseline(runs, baseline, strict_baseline) if runs else None
    if by and runs:
        check_by(runs, by)
    if split_base and runs:
        check_split_value(runs, *split_base)
    # a comparison a claim registered is tested against its region here as on the claims page
    regions = region_lookup(experiment)
    paired = {g.key: g for g in paired_groups(runs, baseline, by=by, regions=regions)}
    split_pairs = ({g.key: g for g in split_pair_groups(runs, *split_base, by, regions=regions)} if split_base
                   else {})
    client = tracking_client.client(uri) if uri else None
    if storage is not None:  # a bad storage URL or study name stops before the folder is made
        from gspo_bench.reporting.study import open_studies, tuning_section

        optuna_storage, studies = open_studies(storage, studies)
    out = Path(out or Path("results") / experiment)
    try:  # an output folder we cannot make or write is the user's input: one line, not a traceback
        probe_writable_dir(out, make=True)
    except OSError as e:
        raise ConfigError(f"--out {str(out)!r}: {e.strerror or e}") from None
    tuning_md, tuning_figs = [], []
    if storage is not None:
        tuning_md, tuning_figs = tuning_section(storage, optuna_storage, studies, out)
    rows = summarise(runs, by)
    finished = [r for r in runs if r.status == FINISHED]
    commits = _distinct(runs, lambda r: r.tags.get("git.commit"))
    source = _distinct(runs, lambda r: r.tags.get("mlflow.source.git.commit"))
    commit = _join(commits, "") or (_join(source, "not recorded") + " (MLflow's source commit; these runs predate "
                                    "the `git.commit` tag)" if source else "not recorded")
    statuses = {s: sum(r.status == s for r in runs) for s in sorted({r.status for r in runs})}
    md = [f"# gspo_bench report: experiment `{experiment}`", "",
          f"- generated: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
          f"- command: `{command or 'python -m gspo_bench report'}`",
          (f"- tracking URI: `{uri}`" if uri else "- runs table" + "s" * (len(files) > 1) + ": "
           + ", ".join(f"`{f}`" for f in files))
          + (f"; filters: task={task!r}, model={model!r}" if task or model else ""),
          f"- runs: {', '.join(f'{n} {s}' for s, n in statuses.items())} (only FINISHED runs are averaged "
          "or plotted)" + (f"; {set_aside(runs)}" if set_aside(runs) else "")
          + (f"; **{mixed}**" if (mixed := mixed_warm_starts(runs)) else ""),
          f"- commit: {commit}",
          f"- machine: {_join(_distinct(runs, lambda r: r.tags.get('machine')), 'not recorded')}", ""]
    if runs:
        md += ["## Configuration", "", *config_table(finished or runs), "",
               "## Leaderboard", "", render(rows, "md"), NOTES, ""]
    else:
        md += ["No benchmark run in this experiment (a study's trial runs are not benchmark runs).", ""]
    groups: dict[tuple, list[RunData]] = {}
    for r in finished:
        groups.setdefault((*r.group, *split_values(r.tags, by)), []).append(r)
    report = Report(out / "report.md")
    if runs and not groups:
        md += ["No finished run: no figures.", ""]
    keys = sorted(groups)
    scaling: dict[tuple, list[ScalingGroup]] = {}  # (h): per group, a fit per metric (eval/pass1 first)
    for metric in fit_metrics(runs):
        for g in scaling_groups(runs, metric, AUTO, by):
            scaling.setdefault(g.key, []).append(g)
    for n, key in enumerate(keys):
        mine = [r for r in rows if (r["task"], r["model"], r["preset"], r["config"], *r.get("by", {}).values()) == key]
        section, figs = group_section(client, key, groups[key], mine, out, paired.get(key), baseline, paired_note, by,
                                      scaling.get(key))
        md += section
        report.figures += figs
        if by and (n + 1 == len(keys) or keys[n + 1][:4] != key[:4]):  # (g) after the group's last split
            section, figs = splits_section(key[:4], {k[4:]: groups[k] for k in keys if k[:4] == key[:4]}, by, out)
            md += section + split_pairs_section(split_pairs.get(key[:4]))
            report.figures += figs
    md += tuning_md
    report.figures += tuning_figs
    md += ["## Raw data", "", f"`{RUNS_FILE}`: every run this report read, one row per run, metric and step "
           "(its tags and params as columns); `python -m gspo_bench report --runs " + RUNS_FILE + "` (or "
           "`leaderboard --runs`) makes this page again without the MLflow store.", ""]
    report.path.write_text(redact("\n".join(md)))  # the command line and URIs, without their credentials
    if [Path(f).resolve() for f in files] != [(out / RUNS_FILE).resolve()]:  # unless it read exactly that file
        write_frame(frame, out / RUNS_FILE)
    if log_to_mlflow:
        report.run_id = log_report(client, experiment_id(client, experiment), report, experiment, len(runs))
    return report


def log_report(client, exp_id: str, report: Report, experiment: str, n_runs: int) -> str:
    mark_experiment(client, exp_id)
    run_id = start_run(client, exp_id, "report",
                       {"kind": "report", "report.experiment": experiment, "report.runs": str(n_runs)})
    with run_lifetime(client, run_id):
        for f in [report.path, *report.figures]:
            client.log_artifact(run_id, str(f))
    return run_id

