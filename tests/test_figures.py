"""The report's figures with every registered algorithm (fifteen): the forest plot (f), the small multiples (a, b).

The synthetic group (task arith, every run FINISHED, seeds 0, 1, 2): grpo's final pass@1 per seed is
0.5 + (0, +0.05, -0.05), mean 0.5. Every other algorithm's final pass@1 on seed s is grpo's plus
(MEANS[algo] + (-1, 0, +1)[s]) points, so its paired differences have mean MEANS[algo] and sd 1 point:
its 95 % t interval is MEANS[algo] -/+ t(0.975, 2) / sqrt(3) = 4.303 / 1.732 = 2.484 points, which excludes 0
exactly when |MEANS[algo]| > 2.484. vespo ran seed 1 only: one pair, difference 3.0, no interval. The group's
MDE pools the thirteen algorithms with three pairs: sd 1 point, d = 3.26 at n = 3, so 3.3 points.

Each run's eval/pass1 rises linearly from 0.40 at step 0 to its final value at step 40 (steps 0, 10, .., 40),
eval/reward_mean is half of it; so grpo's mean curves are 0.400, 0.425, 0.450, 0.475, 0.500 (pass@1) and
0.2000, 0.2125, 0.2250, 0.2375, 0.2500 (reward). clip/frac is 0.001 * (registry position + 1) on steps 1..5.
sapo's seed 2 has one collapse event (eval_drop at step 20).
"""

from __future__ import annotations

import math
import re

import pytest
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgba
from scipy.stats import t as student

from gspo_bench.core.losses import LOSSES
from gspo_bench.reporting import figures
from gspo_bench.reporting.frame import RunData
from gspo_bench.reporting.paired import mde
from gspo_bench.reporting.paired_table import PairedGroup, paired_groups
from gspo_bench.reporting.report import group_section

PNG = b"\x89PNG\r\n\x1a\n"
EVAL_STEPS = (0, 10, 20, 30, 40)
LUCK = (0.0, 0.05, -0.05)  # grpo's final pass@1 per seed, minus 0.5
SPREAD = (-1.0, 0.0, 1.0)  # points added to an algorithm's mean difference per seed
MEANS = {"ppo": -6.0, "dapo": 4.0, "gspo": 1.0, "gspo_token": 0.5, "cispo": -2.0, "sapo": 8.0, "gmpo": -3.5,
         "dr_grpo": 2.0, "luspo": -1.0, "vespo": 3.0, "dppo_tv": 6.0, "dppo_kl": -4.5, "clip_cov": 1.5,
         "kl_cov": -5.0, "rollout_is": -0.5, "dro": 2.2}
# by hand from MEANS: largest first; vespo has one pair. Several intervals exclude 0 (|mean| > 2.484 with three
# pairs), but none is decided: the largest, sapo's t = 8 sqrt(3) = 13.9 on 2 df, has p 0.0052, times the k > 10
# algorithms with a p (Holm's first step) > 0.05
FOREST_ORDER = ["sapo", "dppo_tv", "dapo", "vespo", "dro", "dr_grpo", "clip_cov", "gspo", "gspo_token", "rollout_is",
                "luspo", "cispo", "gmpo", "dppo_kl", "kl_cov", "ppo"]
EXCLUDE_0 = {"sapo", "dppo_tv", "dapo", "gmpo", "dppo_kl", "kl_cov", "ppo"}
GRPO_PASS1 = [0.400, 0.425, 0.450, 0.475, 0.500]
GRPO_REWARD = [0.2000, 0.2125, 0.2250, 0.2375, 0.2500]
KEY = ("arith", "tiny-dense", "default", "default")
LOSSES_INDEX = {a: i for i, a in enumerate(LOSSES)}


def _run(algo: str, seed: int, final: float) -> RunData:
    pass1 = [(s, 0.40 + (final - 0.40) * i / 4) for i, s in enumerate(EVAL_STEPS)]
    history = {"eval/pass1": pass1, "eval/reward_mean": [(s, v / 2) for s, v in pass1],
               "clip/frac": [(s, 0.001 * (LOSSES_INDEX[algo] + 1)) for s in range(1, 6)],
               "reward/mean": [(s, 0.5) for s in range(1, 41)]}
    if algo == "sapo" and seed == 2:
        history["collapse/eval_drop"] = [(20, 1.0)]
    tags = {"algo": algo, "seed": str(seed), "task": KEY[0], "model": KEY[1], "preset": KEY[2]}
    return RunData(f"{algo}-s{seed}", "FINISHED", tags, {}, {}, history)


def _runs(algos=tuple(LOSSES)) -> list[RunData]:
    runs = []
    for algo in algos:
        for seed, (luck, spread) in enumerate(zip(LUCK, SPREAD)):
            if algo == "vespo" and seed != 1:
                continue
            # final = grpo's final on this seed + (mean difference + this seed's spread) points
            diff = 0.0 if algo == "grpo" else (MEANS[algo] + spread) / 100
            runs.append(_run(algo, seed, 0.5 + luck + diff))
    return runs


@pytest.fixture(scope="module")
def runs() -> list[RunData]:
    return _runs()


@pytest.fixture(scope="module")
def group(runs) -> PairedGroup:
    (g,) = paired_groups(runs)
    return g


def _panels(fig, key: str) -> list:
    return [ax for ax in fig.get_axes() if ax.get_label().startswith(f"{key}|")]


def _reference(ax):
    (line,) = [ln for ln in ax.get_lines() if ln.get_gid() == figures.REFERENCE_GID]
    return line


# -- helpers -------------------------------------------------------------------------------------------------------
def test_every_registered_algorithm_gets_a_distinct_colour_none_the_reference_grey():
    index = figures.style_indices(list(LOSSES))
    colours = [figures.PALETTE[index[a] % len(figures.PALETTE)] for a in LOSSES]
    assert len(set(colours)) == len(LOSSES) <= len(figures.PALETTE)
    assert not any(re.fullmatch(r"#(..)\1\1", c) for c in colours)  # no grey: equal r, g, b
    # an algorithm keeps its index whichever others are present; an unregistered one comes after the registry
    n = len(LOSSES)
    assert figures.style_indices(["gspo", "zeta", "alpha"]) == {"gspo": 3, "zeta": n + 1, "alpha": n}


def test_grid_shape_and_reference_algorithm():
    assert [figures.grid_shape(k) for k in (1, 3, 5, 8, 9, 13)] == [(1, 1), (1, 3), (2, 4), (2, 4), (2, 5), (3, 5)]
    assert figures.reference_algo(["ppo", "grpo", "gspo"]) == "grpo"
    assert figures.reference_algo(["ppo", "gspo"]) == "ppo"
    assert figures.reference_algo(["ppo", "gspo"], "gspo") == "gspo"
    assert figures.reference_algo([]) is None


def test_forest_rows_by_hand():
    """Sorted by mean, ties in registry order then by name; only final pass@1 rows with a pair; in points; decided
    only by the Holm-adjusted p (an interval that excludes 0 on its own is not enough)."""
    def row(algo, n, mean, ci=None, metric="final_pass1", p_holm=None):
        return {"metric": metric, "algo": algo, "n": n, "mean_diff": mean, "p_holm": p_holm,
                "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None}

    g = PairedGroup(KEY, "grpo", [
        row("zeta", 3, 0.02, (0.005, 0.035), p_holm=0.03), row("gmpo", 3, 0.02, (-0.01, 0.05), p_holm=0.4),
        row("gspo", 3, 0.02, (0.01, 0.03), p_holm=0.2), row("gspo", 3, 0.9, (0.8, 1.0), metric="auc_pass1"),
        row("dapo", 3, -0.03, (-0.05, -0.01), p_holm=0.01), row("cispo", 3, 0.05, (-0.01, 0.11), p_holm=0.3),
        row("sapo", 1, 0.01), row("ppo", 0, None), row("luspo", 3, 0.015, (0.0, 0.04), p_holm=0.0499)])
    rows = figures.forest_rows(g)
    assert [f.algo for f in rows] == ["cispo", "gspo", "gmpo", "zeta", "luspo", "sapo", "dapo"]
    # gspo's interval excludes 0 but its Holm p does not decide; luspo's p_Holm < 0.05 does
    assert {f.algo for f in rows if f.decided} == {"zeta", "dapo", "luspo"}
    gspo = rows[1]
    assert (gspo.n, gspo.mean, gspo.lo, gspo.hi) == (3, pytest.approx(2.0), pytest.approx(1.0), pytest.approx(3.0))
    assert gspo.value_text() == "+2.0 [+1.0, +3.0]  Holm p 0.200"
    assert rows[3].value_text() == "+2.0 [+0.5, +3.5]  Holm p 0.030  decided"
    assert rows[5].value_text() == "+1.0 (1 pair)" and rows[5].lo is None and not rows[5].decided
    assert rows[0].value_text() == "+5.0 [-1.0, +11.0]  Holm p 0.300"
    holm = figures.forest_rows(PairedGroup(KEY, "grpo", [row("gspo", 3, 0.02, (0.01, 0.03), p_holm=0.0123),
                                                         row("dapo", 3, 0.01, (0.005, 0.015), p_holm=0.0004)]))
    assert [f.value_text() for f in holm] == ["+2.0 [+1.0, +3.0]  Holm p 0.012  decided",
                                              "+1.0 [+0.5, +1.5]  Holm p <0.001  decided"]


# -- (f) the forest plot ---------------------------------------------------------------------------------------------
def _top_to_bottom(ax, labels) -> list[str]:
    """The tick labels of ``ax``'s y axis in the order they appear on screen, top first."""
    ys = [ax.transData.transform((0, y))[1] for y in ax.get_yticks()]
    return [t for _, t in sorted(zip(ys, [lab.get_text() for lab in labels]), reverse=True)]


def test_forest_plot_rows_sorted_decided_filled(group):
    fig = figures.paired_figure(group, "arith / tiny-dense")
    (ax,) = [a for a in fig.get_axes() if a.get_label() == "forest"]
    n = {a: 1 if a == "vespo" else 3 for a in FOREST_ORDER}
    assert _top_to_bottom(ax, ax.get_yticklabels()) == [f"{a} (n={n[a]})" for a in FOREST_ORDER]
    (right,) = ax.child_axes
    values = _top_to_bottom(ax, right.get_yticklabels())
    # the rows come from paired_groups, so each with an interval carries its Holm p (tested in test_paired.py)
    # sapo's p (t = 8 sqrt(3) on 2 df) times the k algorithms with a p: Holm's first step, still above 0.05
    k = len(FOREST_ORDER) - 1
    p_sapo = 2 * student.sf(8 * math.sqrt(3), 2)
    assert k * p_sapo > 0.05 and values[0] == f"+8.0 [+5.5, +10.5]  Holm p {k * p_sapo:.3f}"
    assert values[3] == "+3.0 (1 pair)" and re.fullmatch(r"\+2\.2 \[-0\.3, \+4\.7\]  Holm p [01]\.\d{3}", values[4])
    assert re.fullmatch(r"-6\.0 \[-8\.5, -3\.5\]  Holm p 0\.\d{3}", values[-1])
    assert not any(v.endswith("decided") for v in values)
    excluding = {f.algo for f in figures.forest_rows(group) if f.lo is not None and (f.lo > 0 or f.hi < 0)}
    assert excluding == EXCLUDE_0  # intervals that exclude 0 on their own, none of them decided
    # per row y: the marker (filled iff decided) and the interval line (none for the one-pair row)
    markers = {int(ln.get_ydata()[0]): ln for ln in ax.get_lines() if ln.get_marker() == "o"}
    spans = {int(ln.get_ydata()[0]): tuple(ln.get_xdata()) for ln in ax.get_lines()
             if ln.get_marker() in ("None", "", None) and len(ln.get_xdata()) == 2
             and ln.get_ydata()[0] == ln.get_ydata()[1]}
    for y, algo in enumerate(FOREST_ORDER):
        assert markers[y].get_xdata()[0] == pytest.approx(MEANS[algo])
        assert to_rgba(markers[y].get_markerfacecolor()) == to_rgba("white"), algo  # none decided
        if algo == "vespo":
            assert y not in spans
        else:
            lo, hi = spans[y]
            half = 2.484  # t(0.975, 2) / sqrt(3) points
            assert (lo, hi) == (pytest.approx(MEANS[algo] - half, abs=1e-3),
                                pytest.approx(MEANS[algo] + half, abs=1e-3))
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    # the MDE at Holm's first step over the algorithms with a p for final pass@1 (one pair: vespo has none)
    k = len(FOREST_ORDER) - 1
    assert group.mde_alpha == pytest.approx(0.05 / k) and group.mde == pytest.approx(mde(group.mde_sd, 3, 0.05 / k))
    assert f"± MDE {100 * group.mde:.1f} pts (n=3 pairs, α {0.05 / k:.2g}, 80 % power)" in legend
    (span,) = [p for p in ax.patches if p.get_width() > 0]  # the ± MDE region
    assert span.get_x() == pytest.approx(-100 * group.mde) and span.get_width() == pytest.approx(200 * group.mde)


def test_the_forest_plot_fills_exactly_the_rows_holm_decides():
    # three algorithms: Holm over 3. sapo (p 0.0052 x 3 = 0.016) and ppo (p 0.0091 x 2 = 0.018) are decided;
    # gspo's (+1.0, p 0.225 at the last step) is not; in the larger group above the same sapo and ppo rows are not
    (g,) = paired_groups(_runs(("grpo", "sapo", "ppo", "gspo")))
    fig = figures.paired_figure(g, "arith / tiny-dense")
    (ax,) = [a for a in fig.get_axes() if a.get_label() == "forest"]
    (right,) = ax.child_axes
    values = _top_to_bottom(ax, right.get_yticklabels())
    assert values == ["+8.0 [+5.5, +10.5]  Holm p 0.016  decided", "+1.0 [-1.5, +3.5]  Holm p 0.225",
                      "-6.0 [-8.5, -3.5]  Holm p 0.018  decided"]
    markers = {int(ln.get_ydata()[0]): ln for ln in ax.get_lines() if ln.get_marker() == "o"}
    filled = [to_rgba(markers[y].get_markerfacecolor()) != to_rgba("white") for y in range(3)]
    assert filled == [True, False, True]
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "decided: Holm p < 0.05" in legend and "undecided: Holm p ≥ 0.05" in legend


def test_an_mde_past_100_points_shades_the_whole_scale_and_says_so():
    # grpo and ppo only, ppo's differences -6 + (-40, 0, +40) points: sd 40, n 3, d = 3.26, MDE about 130 points
    runs = [r for r in _runs(("grpo",))]
    runs += [_run("ppo", seed, 0.5 + luck + (-6.0 + spread) / 100)
             for seed, (luck, spread) in enumerate(zip(LUCK, (-40.0, 0.0, 40.0)))]
    (g,) = paired_groups(runs)
    assert 100 * g.mde > 100
    fig = figures.paired_figure(g, "arith / tiny-dense")
    (ax,) = [a for a in fig.get_axes() if a.get_label() == "forest"]
    (span,) = [p for p in ax.patches if p.get_width() > 0]
    assert span.get_x() == pytest.approx(-100) and span.get_width() == pytest.approx(200)
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert any(t.startswith("± MDE > 100 pts (n=3 pairs") for t in legend), legend
    lo, hi = ax.get_xlim()
    # the axis holds the scale and ppo's interval [-105, +93], not the MDE's +/-130
    assert -100 * g.mde < lo < -105 and 100 < hi < 100 * g.mde


def test_plot_paired_keeps_its_signature_and_writes_a_png(group, tmp_path):
    path = figures.plot_paired(group, tmp_path / "paired.png", "arith / tiny-dense")
    assert path == tmp_path / "paired.png" and path.read_bytes().startswith(PNG)


# -- (a), (b): small multiples ---------------------------------------------------------------------------------------
def test_eval_small_multiples_one_panel_per_algorithm_with_the_baseline_in_grey(runs):
    fig = figures.eval_figure(runs, "arith / tiny-dense")
    for key, expected in (("eval/pass1", GRPO_PASS1), ("eval/reward_mean", GRPO_REWARD)):
        panels = _panels(fig, key)
        assert [ax.get_label().split("|")[1] for ax in panels] == list(LOSSES)  # every algorithm, registry order
        assert [ax.get_title() for ax in panels] == [f"{a} (n={1 if a == 'vespo' else 3})" for a in LOSSES]
        assert all(panels[0].get_shared_y_axes().joined(panels[0], ax) for ax in panels)
        assert all(panels[0].get_shared_x_axes().joined(panels[0], ax) for ax in panels)
        for ax in panels:
            ref = _reference(ax)
            assert list(ref.get_xdata()) == list(EVAL_STEPS)
            assert ref.get_ydata() == pytest.approx(expected), ax.get_label()
            # the algorithm's own curve, in its colour
            (own,) = [ln for ln in ax.get_lines() if ln.get_gid() != figures.REFERENCE_GID]
            algo = ax.get_label().split("|")[1]
            assert own.get_color() == figures.PALETTE[LOSSES_INDEX[algo]]
            assert own.get_ydata() == pytest.approx(figures.curve([r for r in runs if r.algo == algo], key)[1])
    # the collapse marker sits on sapo's pass@1 panel only
    marked = [ax.get_label() for ax in fig.get_axes() if any(isinstance(c, PathCollection) for c in ax.collections)]
    assert marked == ["eval/pass1|sapo"]
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert sum("grpo: mean curve" in t for t in legend) == 1  # the reference is labelled once


def test_eval_reference_falls_back_to_the_first_algorithm_and_few_algorithms_overlay():
    no_grpo = _runs(tuple(a for a in LOSSES if a != "grpo"))
    fig = figures.eval_figure(no_grpo, "t")
    ppo = figures.curve([r for r in no_grpo if r.algo == "ppo"], "eval/pass1")
    for ax in _panels(fig, "eval/pass1"):
        assert _reference(ax).get_ydata() == pytest.approx(ppo[1])
    few = figures.eval_figure(_runs(("grpo", "gspo", "dapo", "sapo")), "t")  # four: one overlay pair of axes
    assert len(few.get_axes()) == 2 and not _panels(few, "eval/pass1")
    assert not any(ln.get_gid() == figures.REFERENCE_GID for ax in few.get_axes() for ln in ax.get_lines())


def test_clip_small_multiples_share_a_log_axis_with_the_article_levels(runs):
    fig = figures.clip_figure(runs, "arith / tiny-dense")
    panels = _panels(fig, "clip/frac")
    assert len(panels) == len(LOSSES)
    for ax in panels:
        assert ax.get_yscale() == "log" and ax.get_ylim() == pytest.approx((figures.CLIP_FLOOR / 2, 1.2))
        dotted = sorted(ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_linestyle() == ":")
        assert dotted == pytest.approx(sorted(figures.ARTICLE_CLIP.values()))
        assert _reference(ax).get_ydata() == pytest.approx([0.002] * 5)  # grpo: registry position 1


def test_report_section_with_every_algorithm_links_existing_figures(runs, group, tmp_path):
    md, figs = group_section(None, KEY, runs, [], tmp_path, paired=group)
    text = "\n".join(md)
    assert "a panel per algorithm on shared axes, grpo's mean curve" in text and "Forest plot" in text
    links = re.findall(r"\]\(([^)]+\.png)\)", text)
    assert links == ["eval_arith_tiny-dense.png", "clip_arith_tiny-dense.png", "paired_arith_tiny-dense.png"]
    assert [f.name for f in figs] == links
    for name in links:
        assert (tmp_path / name).read_bytes().startswith(PNG)


def test_a_fit_parameter_at_its_bound_is_labelled_so_and_its_asymptote_not_drawn():
    from types import SimpleNamespace

    import numpy as np
    from matplotlib.figure import Figure

    from gspo_bench.reporting.figures import _scaling_panel, fit_text
    from gspo_bench.reporting.scaling import CurveFit

    free = CurveFit(A=0.62, B=1.3, C_mid=2560.0, R0=0.4, rms=0.01, n=5)
    bounded = CurveFit(A=1.0, B=1.3, C_mid=2560.0, R0=0.4, rms=0.01, n=5, at_bound=(("A", 1.0),))
    assert fit_text(free) == "A=0.620 B=1.30 C_mid=2.56k"
    assert fit_text(bounded, ", ") == "A at bound 1, B=1.30, C_mid=2.56k"
    assert fit_text(bounded, c_mid=False) == "A at bound 1 B=1.30"
    curve = SimpleNamespace(C=np.array([0.0, 1000.0, 2000.0, 4000.0]), R=np.array([0.4, 0.5, 0.55, 0.6]),
                            steps=np.array([0, 10, 20, 40]))
    dashed = {}
    for name, fit in (("free", free), ("bounded", bounded)):
        ax = Figure().subplots()
        _scaling_panel(ax, SimpleNamespace(algo="grpo", curves={"0": curve}, fit=SimpleNamespace(pooled=fit)), 0,
                       solo=False)
        dashed[name] = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert ax.get_lines()[1].get_label() == f"grpo (n=1): {fit_text(fit, ', ')}"
    assert len(dashed["free"]) == 1 and dashed["free"][0].get_ydata()[0] == pytest.approx(0.62)
    assert dashed["bounded"] == []  # A = 1 is the range's end, not an asymptote the runs show
