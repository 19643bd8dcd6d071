"""The report's figures, drawn with matplotlib's object API on the Agg canvas (no pyplot, no global backend).

Each ``plot_*`` takes the FINISHED runs of one leaderboard group (see
``leaderboard.RunData``) and writes one PNG. Curves are the mean over seeds
with a min–max band when there is more than one seed; seeds are aligned on
the steps they logged (a step only some seeds reached averages those).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

from gspo_bench.reporting.frame import RunData

CLIP_FLOOR = 1e-5  # clip/frac is drawn on a log axis: a step with no clipped token is drawn here
ARTICLE_CLIP = {"gspo": 0.15, "grpo": 0.0013}  # GSPO article: ~15 % vs ~0.13 % of tokens clipped
STYLES = ("-", "--", "-.", ":")


def _order() -> dict[str, int]:
    from gspo_bench.core.losses import LOSSES

    return {a: i for i, a in enumerate(LOSSES)}


def by_algo(runs: list[RunData]) -> dict[str, list[RunData]]:
    """Runs per algorithm, algorithms in registry order (ppo, grpo, ...) then any others alphabetically."""
    order = _order()
    out: dict[str, list[RunData]] = {}
    for r in sorted(runs, key=lambda r: (order.get(r.algo, len(order)), r.algo)):
        out.setdefault(r.algo, []).append(r)
    return out


def styled(runs: list[RunData]):
    """(style index, algo, runs): the index is the registry position, so an algorithm keeps its colour
    in every figure whichever others are present."""
    order = _order()
    extra = iter(range(len(order), 100))
    return [(order[a] if a in order else next(extra), a, rs) for a, rs in by_algo(runs).items()]


def _style(i: int) -> dict:
    # colour, dash and width all vary (later lines thinner, drawn on top), so algorithms whose curves
    # coincide (gspo and gspo_token often do) stay tellable
    return {"color": f"C{i % 10}", "linestyle": STYLES[i % len(STYLES)], "linewidth": max(2.8 - 0.35 * i, 1.0)}


def curve(runs: list[RunData], key: str, positive: bool = False):
    """(steps, mean, min, max) over the runs' histories of ``key``; None when no run has it.
    ``positive``: values <= 0 are left out (for a log axis)."""
    per_step: dict[int, list[float]] = {}
    for r in runs:
        for s, v in r.history.get(key, []):
            if math.isfinite(v) and (v > 0 or not positive):
                per_step.setdefault(s, []).append(v)
    if not per_step:
        return None
    steps = np.array(sorted(per_step))
    vals = [per_step[s] for s in steps]
    return (steps, np.array([np.mean(v) for v in vals]), np.array([min(v) for v in vals]),
            np.array([max(v) for v in vals]))


def _draw(ax, runs: list[RunData], key: str, i: int, label: str, transform=None, marker: str | None = "o"):
    c = curve(runs, key)
    if c is None:
        return False
    steps, mean, lo, hi = c if transform is None else (c[0], *map(transform, c[1:]))
    ax.plot(steps, mean, label=label, marker=marker, markersize=3, **_style(i))
    if len(runs) > 1:
        ax.fill_between(steps, lo, hi, color=_style(i)["color"], alpha=0.15, linewidth=0)
    return True


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def plot_eval(runs: list[RunData], path: Path, title: str) -> Path:
    """(a) + (e): eval pass@1 and eval reward mean vs step; collapse events as X markers on pass@1."""
    fig = Figure(figsize=(12, 4.4))
    ax_p, ax_r = fig.subplots(1, 2)
    marked = False
    for i, algo, rs in styled(runs):
        label = f"{algo} (n={len(rs)})"
        _draw(ax_p, rs, "eval/pass1", i, label)
        _draw(ax_r, rs, "eval/reward_mean", i, label)
        mean = curve(rs, "eval/pass1")
        for r in rs:
            for kind, step in r.collapse_steps():
                # on the algorithm's mean curve, where the eye is; the label names the seed
                y = float(np.interp(step, mean[0], mean[1])) if mean is not None else 0.0
                ax_p.scatter([step], [y], marker="X", s=90, color=_style(i)["color"], edgecolors="black",
                             zorder=5, label=None if marked else "collapse event")
                ax_p.annotate(f"{kind} (seed {r.seed})", (step, y), textcoords="offset points", xytext=(4, 6),
                              fontsize=7)
                marked = True
    for ax, name in ((ax_p, "eval pass@1 (greedy, held out)"), (ax_r, "eval reward mean (sampled)")):
        ax.set_xlabel("RL step")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    ax_p.legend(fontsize=8, loc="best")
    band = "mean over seeds, band = min–max" if any(len(v) > 1 for v in by_algo(runs).values()) else "one seed"
    fig.suptitle(f"{title}: evaluation ({band})")
    return _save(fig, path)


def plot_clip(runs: list[RunData], path: Path, title: str) -> Path:
    """(b): clip/frac vs step on a log axis, zeros drawn at ``CLIP_FLOOR``; the article's two levels dotted."""
    fig = Figure(figsize=(8, 4.6))
    ax = fig.subplots()
    for i, algo, rs in styled(runs):
        _draw(ax, rs, "clip/frac", i, f"{algo} (n={len(rs)})", lambda a: np.maximum(a, CLIP_FLOOR), marker=None)
    for algo, level in ARTICLE_CLIP.items():
        ax.axhline(level, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"article: {algo} ≈ {100 * level:g} %", (0.01, level), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=7, color="grey")
    ax.axhline(CLIP_FLOOR, color="black", linewidth=0.6)
    ax.set_yscale("log")
    ax.set_ylim(CLIP_FLOOR / 2, 1.2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{100 * y:g} %"))
    ax.set_xlabel("RL step")
    ax.set_ylabel("clipped tokens (clip/frac)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right", ncols=2)
    ax.set_title(f"{title}: clipped-token fraction (log scale; 0 drawn at {CLIP_FLOOR:g})")
    return _save(fig, path)


def plot_ratios(payload: dict, path: Path, title: str) -> Path:
    """(c): token ratios r and sequence ratios s_i of one batch, with the clip band [1-eps_low, 1+eps_high].

    Left: both densities on a log axis over the ratios' 0.1–99.9 % range.
    GSPO's band (about 1 ± 4e-4) is far narrower than that spread, so a second
    panel shows counts in a window of 6 eps around it when it would be a
    hairline in the first.
    """
    r = np.exp(np.asarray(payload.get("token_log_ratio", []), dtype=float))
    s = np.exp(np.asarray(payload.get("seq_log_ratio", []), dtype=float))
    eps_low, eps_high = payload.get("eps_low"), payload.get("eps_high")
    both = np.concatenate([r, s])
    lo_x, hi_x = np.quantile(both, [0.001, 0.999]) if len(both) else (0.5, 1.5)
    lo_x, hi_x = min(lo_x, 0.999), max(hi_x, 1.001)
    band_lo = 1 - eps_low if eps_low is not None else None
    band_hi = 1 + eps_high if eps_high is not None else None
    narrow = band_lo is not None and band_hi is not None and (band_hi - band_lo) < 0.05 * (hi_x - lo_x)
    fig = Figure(figsize=(12 if narrow else 7.5, 4.4))
    axes = fig.subplots(1, 2 if narrow else 1)
    axes = list(np.atleast_1d(axes))
    inside_r = np.mean((r >= (band_lo or -np.inf)) & (r <= (band_hi or np.inf))) if len(r) else float("nan")
    inside_s = np.mean((s >= (band_lo or -np.inf)) & (s <= (band_hi or np.inf))) if len(s) else float("nan")
    panels = [(axes[0], lo_x, hi_x, 60)]
    if narrow:
        w = 6 * max(eps_low, eps_high)
        panels.append((axes[1], 1 - w, 1 + w, 40))
    for k, (ax, x0, x1, nb) in enumerate(panels):
        bins = np.linspace(x0, x1, nb + 1)
        density = k == 0  # the zoom shows counts: a density over a window's subset would mislead
        ax.hist(r[(r >= x0) & (r <= x1)], bins=bins, density=density, alpha=0.55, color="C0",
                label=f"token r = exp(logp − old_logp)  ({len(r)} tokens, {inside_r:.1%} in band)")
        ax.hist(s[(s >= x0) & (s <= x1)], bins=bins, density=density, alpha=0.55, color="C3",
                label=f"sequence s_i (GSPO)  ({len(s)} seqs, {inside_s:.1%} in band)")
        if band_lo is not None or band_hi is not None:  # a loss with no ratio band (a soft gate) draws none
            ax.axvspan(band_lo if band_lo is not None else x0, band_hi if band_hi is not None else x1, color="C2",
                       alpha=0.25, label=f"clip band [{_edge(1, eps_low, '−')}, {_edge(1, eps_high, '+')}]")
        for edge in (band_lo, band_hi):
            if edge is not None:
                ax.axvline(edge, color="C2", linewidth=1.2)
        ax.set_yscale("log" if density else "linear")
        if not density:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(x0, x1)
        ax.set_xlabel("ratio")
        ax.set_ylabel("density (log scale)" if density else "count")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left")
    if narrow:
        axes[1].set_title("zoom on the clip band (only ratios inside this window)", fontsize=9)
    who = f"{payload.get('algo', '?')} step {payload.get('step', '?')}"
    fig.suptitle(f"{title}: token vs sequence ratios, one batch ({who})")
    return _save(fig, path)


def _edge(one: float, eps, sign: str) -> str:
    return "none" if eps is None else f"{one:g} {sign} {eps:g}"


def plot_moe(runs: list[RunData], path: Path, title: str) -> Path:
    """(d): MoE expert flip rate vs step per algorithm."""
    fig = Figure(figsize=(8, 4.4))
    ax = fig.subplots()
    for i, algo, rs in styled(runs):
        _draw(ax, rs, "moe/expert_flip_rate", i, f"{algo} (n={len(rs)})", marker=None)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("RL step")
    ax.set_ylabel("expert flip rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{title}: MoE routing changes per update (moe/expert_flip_rate)")
    return _save(fig, path)


def plot_paired(group, path: Path, title: str) -> Path:
    """(f): per algorithm, the mean paired difference in final pass@1 to the baseline (points), its 95 % t
    interval as an error bar (none with one pair), a zero line and, dotted, ± the group's MDE.

    ``group`` is a ``paired_table.PairedGroup``; algorithms with no pair are left out.
    """
    rows = [r for r in group.rows if r["metric"] == "final_pass1" and r["n"] > 0]
    order = _order()
    fig = Figure(figsize=(max(5.0, 1.3 * len(rows) + 2.5), 4.4))
    ax = fig.subplots()
    ax.axhline(0, color="black", linewidth=1)
    if group.mde is not None:
        for sign in (1, -1):
            ax.axhline(sign * 100 * group.mde, color="grey", linestyle=":", linewidth=1,
                       label=f"± MDE ({100 * group.mde:.1f} pts, n={group.mde_n}, 80 % power)" if sign > 0 else None)
    for x, r in enumerate(rows):
        i = order.get(r["algo"], len(order) + x)
        mean = 100 * r["mean_diff"]
        if r["ci_low"] is not None:
            err = [[mean - 100 * r["ci_low"]], [100 * r["ci_high"] - mean]]
            ax.errorbar([x], [mean], yerr=err, fmt="o", capsize=6, markersize=7, color=_style(i)["color"])
        else:  # one pair: the difference alone, hollow
            ax.plot([x], [mean], "o", markersize=7, markerfacecolor="white", color=_style(i)["color"])
        if r["significant"]:
            ax.annotate("*", (x, mean), textcoords="offset points", xytext=(8, 0), fontsize=14, va="center")
    ax.set_xticks(range(len(rows)), [f"{r['algo']}\nn={r['n']}" for r in rows])
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylabel(f"final pass@1: algo − {group.baseline} (points)")
    ax.grid(alpha=0.3, axis="y")
    if group.mde is not None:
        ax.legend(fontsize=8, loc="best")
    ax.set_title(f"{title}: final pass@1, paired difference vs {group.baseline}\n"
                 "per seed; mean and 95 % t interval, * = interval excludes 0", fontsize=10)
    return _save(fig, path)


# (g): the rows of the splits figure, in order: (metric, y label, log axis, percent axis)
SPLIT_METRICS = (("eval/pass1", "eval pass@1", False, False), ("mismatch/kl", "mismatch/kl (log)", True, False),
                 ("moe/routing_mismatch", "routing mismatch", False, True),
                 ("moe/expert_flip_rate", "expert flip rate", False, True))


def plot_splits(splits: dict[str, list[RunData]], metrics: list[str], path: Path, title: str) -> Path:
    """(g): the ``--by`` splits of one group side by side: a row per metric in ``metrics`` (those of
    ``SPLIT_METRICS`` some run logged), a column per algorithm, a line per split (``splits``: label -> its
    runs) = the mean over its seeds per step, band = min–max over them; one legend for all panels.

    A split keeps its colour in every panel. ``mismatch/kl`` is on a log axis: its values <= 0 are left out.
    """
    algos = list(by_algo([r for rs in splits.values() for r in rs]))
    rows = [m for m in SPLIT_METRICS if m[0] in metrics]
    fig = Figure(figsize=(3.8 * len(algos) + 0.6, 2.7 * len(rows) + 0.9), layout="constrained")
    # one y range per row, so the algorithms' panels compare at a glance
    axes = np.array(fig.subplots(len(rows), len(algos), sharex=True, sharey="row", squeeze=False))
    handles = {}
    for (key, label, log, pct), row in zip(rows, axes):
        for algo, ax in zip(algos, row):
            drawn = False
            for j, (name, runs) in enumerate(splits.items()):
                mine = [r for r in runs if r.algo == algo]
                c = curve(mine, key, positive=log)
                if c is None:
                    continue
                steps, mean, lo, hi = c
                (line,) = ax.plot(steps, mean, marker="o" if len(steps) <= 12 else None, markersize=3, **_style(j))
                handles.setdefault(name, line)
                if len(mine) > 1:  # the band: min..max over the split's seeds at each step
                    ax.fill_between(steps, lo, hi, color=_style(j)["color"], alpha=0.15, linewidth=0)
                drawn = True
            if not drawn:
                ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="grey")
            elif log:
                ax.set_yscale("log")
            if pct:
                ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.grid(alpha=0.3, which="both" if log else "major")
        row[0].set_ylabel(label)
    for algo, ax in zip(algos, axes[0]):
        ax.set_title(algo)
    for ax in axes[-1]:
        ax.set_xlabel("RL step")
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(len(handles), 3),
               fontsize=8)
    fig.suptitle(f"{title}: splits compared (mean over seeds, band = min–max)")
    return _save(fig, path)
