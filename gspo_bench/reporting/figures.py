"""The report's figures, drawn with matplotlib's object API on the Agg canvas (no pyplot, no global backend).

Each ``plot_*`` takes the FINISHED runs of one leaderboard group (see
``frame.RunData``) and writes one PNG. Curves are the mean over seeds
with a min–max band when there is more than one seed; seeds are aligned on
the steps they logged (a step only some seeds reached averages those).

Up to ``OVERLAY_MAX`` algorithms share one axes. With more, the curve figures
(eval, clip, MoE flip rate) become small multiples: a panel per algorithm on
shared axes, each with the reference algorithm's mean curve (``--baseline``,
grpo by default, else the first present) as a thin grey line. The paired
differences are a forest plot: a row per algorithm, sorted by mean. The
compute-scaling figure (``plot_scaling``) draws eval scores against rollout
compute on a log axis with each algorithm's fitted ScaleRL curve
(``scaling_table.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter, PercentFormatter

from gspo_bench.reporting.frame import RunData
from gspo_bench.reporting.leaderboard import DEFAULT_BASELINE
from gspo_bench.reporting.pairing import POWER, level_text
from gspo_bench.reporting.scaling_table import UNIT_TEXT, compact

CLIP_FLOOR = 1e-5  # clip/frac is drawn on a log axis: a step with no clipped token is drawn here
ARTICLE_CLIP = {"gspo": 0.15, "grpo": 0.0013}  # GSPO article: ~15 % vs ~0.13 % of tokens clipped
STYLES = ("-", "--", "-.", ":")
# one colour per registry position (17 algorithms, none grey: grey is the reference curve's), then round again
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#1b1b7a", "#bcbd22",
           "#17becf", "#a6761d", "#00796b", "#b5005b", "#7570b3", "#66a61e", "#e6ab02", "#6a3d9a")
OVERLAY_MAX = 4  # up to this many algorithms share one axes; more get a panel each
REFERENCE_COLOR = "0.35"  # the reference algorithm's mean curve in every small-multiples panel
REFERENCE_GID = "reference"  # its line's gid, so a reader (or a test) can find it
UNDECIDED_COLOR = "0.45"  # forest plot: the labels of rows whose interval holds 0


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


def style_indices(algos: list[str]) -> dict[str, int]:
    """Each algorithm's style index: its registry position, so it keeps its colour in every figure whichever
    others are present; an unregistered one gets the next free index in alphabetical order."""
    order = _order()
    extra = sorted({a for a in algos if a not in order})
    return {a: order[a] if a in order else len(order) + extra.index(a) for a in algos}


def styled(runs: list[RunData]):
    """(style index, algo, runs), algorithms in ``by_algo`` order; the index is ``style_indices``'."""
    groups = by_algo(runs)
    index = style_indices(list(groups))
    return [(index[a], a, rs) for a, rs in groups.items()]


def _style(i: int) -> dict:
    # colour, dash and width all vary (later lines thinner, drawn on top), so algorithms whose curves
    # coincide (gspo and gspo_token often do) stay tellable
    return {"color": PALETTE[i % len(PALETTE)], "linestyle": STYLES[i % len(STYLES)],
            "linewidth": max(2.8 - 0.35 * i, 1.0)}


def _solo(i: int) -> dict:
    """The style of an algorithm alone in its panel: its colour, solid, one width."""
    return {"color": PALETTE[i % len(PALETTE)], "linestyle": "-", "linewidth": 1.8}


def reference_algo(algos: list[str], preferred: str = DEFAULT_BASELINE) -> str | None:
    """The algorithm whose mean curve every small-multiples panel repeats: ``preferred`` when present, else
    the first of ``algos``; None when there is none."""
    return preferred if preferred in algos else (algos[0] if algos else None)


def grid_shape(k: int) -> tuple[int, int]:
    """(rows, columns) of ``k`` panels: 4 columns up to 8 panels, 5 beyond, fewer when ``k`` is smaller."""
    cols = max(1, min(k, 4 if k <= 8 else 5))
    # rows = ceil(k / cols)
    return math.ceil(k / cols) if k else 1, cols


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


def _draw(ax, runs: list[RunData], key: str, i: int, label: str | None, transform=None, marker: str | None = "o",
          solo: bool = False):
    c = curve(runs, key)
    if c is None:
        return False
    steps, mean, lo, hi = c if transform is None else (c[0], *map(transform, c[1:]))
    style = _solo(i) if solo else _style(i)
    ax.plot(steps, mean, label=label, marker=marker, markersize=3, **style)
    if len(runs) > 1:
        ax.fill_between(steps, lo, hi, color=style["color"], alpha=0.18 if solo else 0.15, linewidth=0)
    return True


def _mark_collapses(ax, runs: list[RunData], i: int, fontsize: float = 7, labelled: bool = False) -> bool:
    """X markers at each collapse event of ``runs``, on their mean pass@1 curve, the first one labelled for the
    legend unless ``labelled`` (another already is); True when one was drawn."""
    mean = curve(runs, "eval/pass1")
    drawn = False
    for r in runs:
        for kind, step in r.collapse_steps():
            # on the algorithm's mean curve, where the eye is; the label names the seed
            y = float(np.interp(step, mean[0], mean[1])) if mean is not None else 0.0
            ax.scatter([step], [y], marker="X", s=90 if fontsize >= 7 else 60, color=PALETTE[i % len(PALETTE)],
                       edgecolors="black", zorder=5, label=None if labelled or drawn else "collapse event")
            ax.annotate(f"{kind} (seed {r.seed})", (step, y), textcoords="offset points", xytext=(4, 6),
                        fontsize=fontsize)
            drawn = True
    return drawn


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _grid(container, k: int) -> list:
    """``k`` panels in ``grid_shape(k)`` on ``container`` (a figure or subfigure), x and y shared; the unused
    cells of the last row are removed and the panels above them keep their x tick labels."""
    rows, cols = grid_shape(k)
    axes = list(np.atleast_1d(container.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)).ravel())
    for ax in axes[k:]:
        ax.remove()
    for j, ax in enumerate(axes[:k]):
        if j + cols >= k:  # no panel below this one
            ax.xaxis.set_tick_params(labelbottom=True)
    return axes[:k]


def _multiples(container, groups: list, key: str, ylabel: str, reference: str | None, transform=None,
               marker: str | None = None, collapses: bool = False) -> tuple[list, bool]:
    """Small multiples of ``key``: a panel per (style index, algo, runs) of ``groups`` (``styled``' list), titled
    ``algo (n=K)`` in its colour, its mean curve and min–max band, and the ``reference`` algorithm's mean curve
    as a thin grey line (gid ``REFERENCE_GID``) in every panel. Each panel's label is ``key|algo``.
    Returns (the panels, whether a collapse marker was drawn)."""
    axes = _grid(container, len(groups))
    ref_runs = next((rs for _, a, rs in groups if a == reference), [])
    ref = curve(ref_runs, key) if ref_runs else None
    marked = False
    for ax, (i, algo, rs) in zip(axes, groups):
        ax.set_label(f"{key}|{algo}")
        if ref is not None:
            ref_mean = ref[1] if transform is None else transform(ref[1])
            ax.plot(ref[0], ref_mean, color=REFERENCE_COLOR, linewidth=0.9, zorder=1.9, gid=REFERENCE_GID)
        if not _draw(ax, rs, key, i, None, transform, marker, solo=True):
            ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="grey",
                    fontsize=8)
        if collapses:
            marked = _mark_collapses(ax, rs, i, fontsize=6) or marked
        ax.set_title(f"{algo} (n={len(rs)})", color=PALETTE[i % len(PALETTE)], fontsize=9, fontweight="bold",
                     pad=3)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    container.supxlabel("RL step", fontsize=9)
    container.supylabel(ylabel, fontsize=9)
    return axes, marked


def _multiples_figure(groups: list, key: str, ylabel: str, reference: str, transform=None):
    """A figure of ``key``'s small multiples alone (``_multiples``), sized to its grid: (figure, panels, the
    reference algorithm drawn in grey)."""
    ref = reference_algo([a for _, a, _ in groups], reference)
    rows, cols = grid_shape(len(groups))
    fig = Figure(figsize=(3.2 * cols, 2.2 * rows + 1.3), layout="constrained")
    axes, _ = _multiples(fig, groups, key, ylabel, ref, transform)
    return fig, axes, ref


def _multiples_legend(fig: Figure, reference: str | None, marked: bool, seeds: bool, extra: tuple = ()) -> None:
    """One legend under the panels: the reference line (labelled once for all panels), the band, collapse
    markers when drawn, and ``extra`` handles."""
    handles = []
    if reference is not None:
        handles.append(Line2D([], [], color=REFERENCE_COLOR, linewidth=0.9,
                              label=f"{reference}: mean curve, repeated in every panel for reference"))
    if seeds:
        handles.append(Patch(color="0.5", alpha=0.3, label="band: min–max over seeds"))
    if marked:
        handles.append(Line2D([], [], marker="X", linestyle="", markersize=8, color="0.6", markeredgecolor="black",
                              label="collapse event (kind, seed)"))
    handles += list(extra)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3), fontsize=8)


def eval_figure(runs: list[RunData], title: str, reference: str = DEFAULT_BASELINE) -> Figure:
    """The figure ``plot_eval`` writes: one overlay axes pair up to ``OVERLAY_MAX`` algorithms, else two blocks
    of small multiples, eval pass@1 on top, eval reward mean below."""
    groups = styled(runs)
    band = "mean over seeds, band = min–max" if any(len(v) > 1 for v in by_algo(runs).values()) else "one seed"
    if len(groups) <= OVERLAY_MAX:
        return _eval_overlay(groups, title, band)
    ref = reference_algo([a for _, a, _ in groups], reference)
    rows, cols = grid_shape(len(groups))
    fig = Figure(figsize=(3.2 * cols, 2 * (2.1 * rows + 0.6) + 0.9), layout="constrained")
    top, bottom = fig.subfigures(2, 1)
    _, marked = _multiples(top, groups, "eval/pass1", "eval pass@1", ref, marker="o", collapses=True)
    _multiples(bottom, groups, "eval/reward_mean", "eval reward mean", ref, marker="o")
    top.suptitle("eval pass@1 (greedy, held out)", fontsize=10)
    bottom.suptitle("eval reward mean (sampled)", fontsize=10)
    _multiples_legend(fig, ref, marked, band != "one seed")
    fig.suptitle(f"{title}: evaluation ({band}), a panel per algorithm")
    return fig


def _eval_overlay(groups: list, title: str, band: str) -> Figure:
    fig = Figure(figsize=(12, 4.4))
    ax_p, ax_r = fig.subplots(1, 2)
    marked = False
    for i, algo, rs in groups:
        label = f"{algo} (n={len(rs)})"
        _draw(ax_p, rs, "eval/pass1", i, label)
        _draw(ax_r, rs, "eval/reward_mean", i, label)
        marked = _mark_collapses(ax_p, rs, i, labelled=marked) or marked
    for ax, name in ((ax_p, "eval pass@1 (greedy, held out)"), (ax_r, "eval reward mean (sampled)")):
        ax.set_xlabel("RL step")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    ax_p.legend(fontsize=8, loc="best")
    fig.suptitle(f"{title}: evaluation ({band})")
    return fig


def plot_eval(runs: list[RunData], path: Path, title: str, reference: str = DEFAULT_BASELINE) -> Path:
    """(a) + (e): eval pass@1 and eval reward mean vs step; collapse events as X markers on pass@1
    (``eval_figure``)."""
    return _save(eval_figure(runs, title, reference), path)


def _clip_floor(a: np.ndarray) -> np.ndarray:
    return np.maximum(a, CLIP_FLOOR)


def _clip_axis(ax, annotate: bool = True) -> None:
    """The log clip/frac axis: the article's two levels dotted (named when ``annotate``), the floor line."""
    for algo, level in ARTICLE_CLIP.items():
        ax.axhline(level, color="grey", linestyle=":", linewidth=1)
        if annotate:
            ax.annotate(f"article: {algo} ≈ {100 * level:g} %", (0.01, level), xycoords=("axes fraction", "data"),
                        xytext=(0, 3), textcoords="offset points", fontsize=7, color="grey")
    ax.axhline(CLIP_FLOOR, color="black", linewidth=0.6)
    ax.set_yscale("log")
    ax.set_ylim(CLIP_FLOOR / 2, 1.2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{100 * y:g} %"))


def clip_figure(runs: list[RunData], title: str, reference: str = DEFAULT_BASELINE) -> Figure:
    """The figure ``plot_clip`` writes: one overlay axes up to ``OVERLAY_MAX`` algorithms, else small multiples
    on a shared log axis, the article's two levels dotted in each panel."""
    groups = styled(runs)
    head = f"{title}: clipped-token fraction (log scale; 0 drawn at {CLIP_FLOOR:g})"
    if len(groups) > OVERLAY_MAX:
        fig, axes, ref = _multiples_figure(groups, "clip/frac", "clipped tokens (clip/frac)", reference, _clip_floor)
        for ax in axes:  # the levels are named once, in the legend: a panel's text would cover its curves
            _clip_axis(ax, annotate=False)
        article = Line2D([], [], color="grey", linestyle=":", linewidth=1,
                         label="the GSPO article's levels: gspo ≈ 15 % (upper), grpo ≈ 0.13 % (lower)")
        _multiples_legend(fig, ref, False, any(len(rs) > 1 for _, _, rs in groups), (article,))
        fig.suptitle(f"{head}, a panel per algorithm")
        return fig
    fig = Figure(figsize=(8, 4.6))
    ax = fig.subplots()
    for i, algo, rs in groups:
        _draw(ax, rs, "clip/frac", i, f"{algo} (n={len(rs)})", _clip_floor, marker=None)
    _clip_axis(ax)
    ax.set_xlabel("RL step")
    ax.set_ylabel("clipped tokens (clip/frac)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right", ncols=2)
    ax.set_title(head)
    return fig


def plot_clip(runs: list[RunData], path: Path, title: str, reference: str = DEFAULT_BASELINE) -> Path:
    """(b): clip/frac vs step on a log axis, zeros drawn at ``CLIP_FLOOR``; the article's two levels dotted
    (``clip_figure``)."""
    return _save(clip_figure(runs, title, reference), path)


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


def plot_moe(runs: list[RunData], path: Path, title: str, reference: str = DEFAULT_BASELINE) -> Path:
    """(d): MoE expert flip rate vs step per algorithm (small multiples beyond ``OVERLAY_MAX`` algorithms)."""
    groups = styled(runs)
    head = f"{title}: MoE routing changes per update (moe/expert_flip_rate)"
    if len(groups) > OVERLAY_MAX:
        fig, axes, ref = _multiples_figure(groups, "moe/expert_flip_rate", "expert flip rate", reference)
        axes[0].yaxis.set_major_formatter(PercentFormatter(1.0))  # shared y: one formatter for all panels
        _multiples_legend(fig, ref, False, any(len(rs) > 1 for _, _, rs in groups))
        fig.suptitle(f"{head}, a panel per algorithm")
        return _save(fig, path)
    fig = Figure(figsize=(8, 4.4))
    ax = fig.subplots()
    for i, algo, rs in groups:
        _draw(ax, rs, "moe/expert_flip_rate", i, f"{algo} (n={len(rs)})", marker=None)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("RL step")
    ax.set_ylabel("expert flip rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(head)
    return _save(fig, path)


DECIDE_ALPHA = 0.05  # a forest row is decided when its Holm-adjusted p is below this


@dataclass(frozen=True)
class ForestRow:
    """One row of the forest plot: an algorithm's paired difference in final pass@1 to the baseline, in points."""

    algo: str
    n: int  # pairs
    mean: float
    lo: float | None  # the 95 % t interval; None with one pair
    hi: float | None
    p_holm: float | None = None  # the paired t test's p, Holm-adjusted over the group's algorithms

    @property
    def decided(self) -> bool:
        """Decided under the project's one multiplicity rule: the Holm-adjusted p over the group's final pass@1
        family is below 0.05 (an interval that excludes 0 on its own is not enough)."""
        # decided  <=>  p_Holm < 0.05
        return self.lo is not None and self.p_holm is not None and self.p_holm < DECIDE_ALPHA

    def value_text(self) -> str:
        """``mean [lo, hi]`` in signed points (``mean (1 pair)`` without an interval), then the Holm p when there
        is one, then ``decided`` when it is below 0.05."""
        if self.lo is None:
            return f"{self.mean:+.1f} (1 pair)"
        holm = "" if self.p_holm is None else f"  Holm p {'<0.001' if self.p_holm < 0.001 else f'{self.p_holm:.3f}'}"
        return f"{self.mean:+.1f} [{self.lo:+.1f}, {self.hi:+.1f}]{holm}" + ("  decided" if self.decided else "")


def forest_rows(group) -> list[ForestRow]:
    """The forest plot's rows, top to bottom: each algorithm of ``group`` (a ``paired_table.PairedGroup``) with
    a final pass@1 pair, largest mean difference first (ties: registry order, then name); values in points."""
    order = _order()
    rows = []
    for r in group.rows:
        if r["metric"] != "final_pass1" or r["n"] <= 0:
            continue
        # points = 100 x pass@1 units
        lo, hi = (None, None) if r["ci_low"] is None else (100 * r["ci_low"], 100 * r["ci_high"])
        rows.append(ForestRow(r["algo"], r["n"], 100 * r["mean_diff"], lo, hi, r.get("p_holm")))
    return sorted(rows, key=lambda f: (-f.mean, order.get(f.algo, len(order)), f.algo))


def _forest_xlim(rows: list[ForestRow], mde_pts: float | None) -> tuple[float, float]:
    """x range holding every point and interval, 0 and ± the MDE, with 8 % padding each side."""
    xs = [0.0] + [x for f in rows for x in (f.mean, f.lo, f.hi) if x is not None]
    if mde_pts is not None:
        xs += [-mde_pts, mde_pts]
    lo, hi = min(xs), max(xs)
    # pad = 8 % of the span (1 point when every value is 0)
    pad = 0.08 * (hi - lo) or 1.0
    return lo - pad, hi + pad


def paired_figure(group, title: str) -> Figure:
    """The forest plot ``plot_paired`` writes: a row per algorithm (``forest_rows``), largest mean on top, its
    mean and 95 % t interval; decided rows (Holm p < 0.05) filled with a solid line, undecided ones
    hollow with a faint line and grey label, a one-pair row hollow with no line; the zero line, ± the group's
    MDE shaded; ``algo (n=K)`` on the left, ``mean [lo, hi]`` on the right."""
    rows = forest_rows(group)
    index = style_indices([f.algo for f in rows] + [group.baseline])
    mde_pts = None if group.mde is None else 100 * group.mde
    # past 100 points no pass@1 difference could be detected: shade the whole scale, and say so
    shade = None if mde_pts is None else min(mde_pts, 100.0)
    fig = Figure(figsize=(8.5, 0.36 * len(rows) + 2.3), layout="constrained")
    ax = fig.subplots()
    ax.set_label("forest")
    handles = []
    if mde_pts is not None:
        ax.axvspan(-shade, shade, color="0.92", linewidth=0, zorder=0)
        # the MDE at the level that decides final pass@1 for the group (Holm's first step)
        size = f"{mde_pts:.1f}" if mde_pts <= 100 else "> 100"
        handles.append(Patch(color="0.92", label=f"± MDE {size} pts (n={group.mde_n} pairs, "
                                                 f"{level_text(group.mde_alpha)}, {100 * POWER:g} % power)"))
    ax.axvline(0, color="black", linewidth=1, zorder=1)
    for y, f in enumerate(rows):
        color = PALETTE[index[f.algo] % len(PALETTE)]
        if f.lo is not None:
            ax.plot([f.lo, f.hi], [y, y], color=color, linewidth=2.4 if f.decided else 1.4,
                    alpha=1.0 if f.decided else 0.45, solid_capstyle="butt", zorder=2)
        ax.plot([f.mean], [y], "o", markersize=7, color=color, markeredgewidth=1.5, zorder=3,
                markerfacecolor=color if f.decided else "white")
    ax.set_yticks(range(len(rows)), [f"{f.algo} (n={f.n})" for f in rows])
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(len(rows)), [f.value_text() for f in rows])
    for labels in (ax.get_yticklabels(), right.get_yticklabels()):
        for lab, f in zip(labels, rows):
            lab.set_color("black" if f.decided else UNDECIDED_COLOR)
            lab.set_fontweight("bold" if f.decided else "normal")
            lab.set_fontsize(8.5)
    for lab in right.get_yticklabels():
        lab.set_family("monospace")
    right.tick_params(length=0)
    ax.tick_params(axis="y", length=0)
    # row 0 (the largest mean) on top
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)
    ax.set_xlim(*_forest_xlim(rows, shade))
    ax.set_xlabel(f"final pass@1: algo − {group.baseline} (points)")
    ax.grid(alpha=0.3, axis="x")
    handles += [Line2D([], [], color="0.2", marker="o", linewidth=2.4, markersize=7,
                       label="decided: Holm p < 0.05"),
                Line2D([], [], color="0.2", marker="o", linewidth=1.4, alpha=0.45, markersize=7,
                       markerfacecolor="white", label="undecided: Holm p ≥ 0.05"),
                Line2D([], [], color="0.2", marker="o", linestyle="", markersize=7, markerfacecolor="white",
                       label="one pair: no interval")]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8)
    fig.suptitle(f"{title}: final pass@1, paired difference vs {group.baseline}\nper seed; mean and 95 % t "
                 "interval, sorted by mean; decided = Holm p < 0.05, the p adjusted over the group's algorithms",
                 fontsize=10)
    return fig


def plot_paired(group, path: Path, title: str) -> Path:
    """(f): the forest plot of the mean paired differences in final pass@1 to the baseline (``paired_figure``).

    ``group`` is a ``paired_table.PairedGroup``; algorithms with no pair are left out.
    """
    return _save(paired_figure(group, title), path)


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


def _scaling_panel(ax, a, i: int, solo: bool, label: bool = True) -> None:
    """One algorithm's compute-scaling data on ``ax`` (log x): every seed's evaluations with C > 0 as faint
    dots, their mean per step as markers joined by a thin line, and the pooled fitted curve, solid over the
    data and dotted past it (to 4 x the largest C), with its asymptote A as a dashed line."""
    style = _solo(i) if solo else _style(i)
    color = style["color"]
    xs = np.concatenate([c.C[c.C > 0] for c in a.curves.values()])
    ys = np.concatenate([c.R[c.C > 0] for c in a.curves.values()])
    ax.scatter(xs, ys, s=9, color=color, alpha=0.3, linewidths=0)
    steps = sorted({int(s) for c in a.curves.values() for s in c.steps[c.C > 0]})
    # the mean over seeds at each step: mean C, mean R (seeds differ in C only on the token axis)
    mean = [(np.mean(sel[0]), np.mean(sel[1])) for s in steps
            for sel in [(np.concatenate([c.C[c.steps == s] for c in a.curves.values()]),
                         np.concatenate([c.R[c.steps == s] for c in a.curves.values()]))]]
    if mean:
        ax.plot(*zip(*mean), marker="o", markersize=4, color=color, linestyle="none")
    fit = a.fit.pooled
    name = f"{a.algo} (n={len(a.curves)})"
    if fit is None:
        ax.plot([], [], color=color, label=f"{name}: no fit" if label else None)
        return
    top = float(xs.max())
    inside = np.geomspace(float(xs.min()) / 2, top, 80)
    ax.plot(inside, fit.predict(inside), color=color, linewidth=style["linewidth"],
            label=f"{name}: {fit_text(fit, ', ')}" if label else None)
    past = np.geomspace(top, 4 * top, 30)
    ax.plot(past, fit.predict(past), color=color, linewidth=1.0, linestyle=":")
    if fit.bound("A") is None:  # an asymptote at its bound is the range's end, not something the data show
        ax.axhline(fit.A, color=color, linewidth=0.8, linestyle="--", alpha=0.6)


def fit_text(fit, sep: str = " ", c_mid: bool = True) -> str:
    """A fit's parameters for a label, ``A=0.620 B=1.30 C_mid=2.56k``; one the data leave at its bound reads
    ``A at bound 1`` (not identified: no value claimed)."""
    shown = [("A", f"{fit.A:.3f}"), ("B", f"{fit.B:.2f}")] + ([("C_mid", compact(fit.C_mid))] if c_mid else [])
    return sep.join(f"{name} at bound {fit.bound(name):g}" if fit.bound(name) is not None else f"{name}={text}"
                    for name, text in shown)


def scaling_figure(group, title: str) -> Figure:
    """The figure ``plot_scaling`` writes for one ``scaling_table.ScalingGroup``: eval score against compute
    (log x), the warm start R0 as a grey line; one axes up to ``OVERLAY_MAX`` algorithms, else a panel per
    algorithm on shared axes, each titled with its fit."""
    index = style_indices([a.algo for a in group.algos])
    algos = sorted(group.algos, key=lambda a: index[a.algo])
    r0 = next((a.fit.pooled.R0 for a in algos if a.fit.pooled is not None), None)
    xlabel = f"{UNIT_TEXT[group.unit]} (log scale)"
    if len(algos) <= OVERLAY_MAX:
        fig = Figure(figsize=(8.5, 5), layout="constrained")
        ax = fig.subplots()
        axes = [ax]
        for a in algos:
            _scaling_panel(ax, a, index[a.algo], solo=False)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(group.metric)
        ax.legend(fontsize=7, loc="lower right")
    else:
        rows, cols = grid_shape(len(algos))
        fig = Figure(figsize=(3.2 * cols, 2.3 * rows + 1.4), layout="constrained")
        axes = _grid(fig, len(algos))
        for ax, a in zip(axes, algos):
            i = index[a.algo]
            ax.set_label(f"scaling|{a.algo}")
            _scaling_panel(ax, a, i, solo=True, label=False)
            fit = a.fit.pooled
            ax.set_title(f"{a.algo}: " + (fit_text(fit, c_mid=False) if fit else "no fit"),
                         color=PALETTE[i % len(PALETTE)], fontsize=9, fontweight="bold", pad=3)
            ax.tick_params(labelsize=7)
        for j, ax in enumerate(axes):
            if j + cols >= len(axes):  # the lowest panel of its column
                ax.set_xlabel(xlabel, fontsize=8)
        fig.supylabel(group.metric, fontsize=9)
        handles = [Line2D([], [], color="0.3", linewidth=1.8, label="pooled fit R(C)"),
                   Line2D([], [], color="0.3", linestyle=":", label="the fit past the last evaluation"),
                   Line2D([], [], color="0.3", linestyle="--", label="asymptote A (not drawn at its bound)"),
                   Line2D([], [], marker="o", linestyle="", color="0.3", label="mean over seeds per step; dots: seeds")]
        fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8)
    for ax in axes:
        ax.set_xscale("log")
        # major ticks as 2.56k / 10k, minor ones unlabelled (their labels collide on a narrow panel)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: compact(v)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
        if r0 is not None:
            ax.axhline(r0, color=REFERENCE_COLOR, linewidth=0.9, linestyle="-.", zorder=1)
    fig.suptitle(f"{title}: {group.metric} against rollout compute, ScaleRL fit "
                 f"(grey dash-dot: warm start R0 = {r0:.3f})" if r0 is not None else
                 f"{title}: {group.metric} against rollout compute, ScaleRL fit")
    return fig


def plot_scaling(group, path: Path, title: str) -> Path:
    """(h): a group's evaluations against rollout compute with each algorithm's pooled ScaleRL fit
    (``scaling_figure``)."""
    return _save(scaling_figure(group, title), path)
