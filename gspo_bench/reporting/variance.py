"""Where the spread between seeds comes from: warm start, training and evaluation (``variance`` command).

A run's final greedy pass@1 (in points) is read as

    y = mu_algo + W_seed + T_run + E_run

- ``W``: what the run's seed fixes before RL starts: the task's data (train and eval prompts), the initial
  weights and the warm start. Every algorithm of a seed shares it, and so do RL draws repeated from it.
- ``T``: training noise, RL's own draws (sampling, prompt order, minibatches), moved by ``train.rl_seed``
  alone: two runs of one seed with different ``rl_seed`` differ in ``T`` (and ``E``), never in ``W``.
- ``E``: evaluation noise, the greedy score's error from the finite set of eval prompts. The evaluator logs
  greedy pass@1 on the two halves of its prompts (``eval/pass1_even``, ``eval/pass1_odd``: independent random
  halves), and since the full score is their mean, var(even - odd) = 4 var(E): each run's (even - odd)^2 / 4 is
  an unbiased estimate of var(E).

The same split holds for a paired difference d = y_algo - y_baseline (same seed, same RL draw: what the paired
tables compare): ``W`` becomes the seed's interaction with the algorithm, ``T`` and ``E`` the differences'.

Estimates, per algorithm (its lift: final minus the warm start's own score, a per-seed constant that sits in
``W``) and per paired comparison, from seeds with ``k`` >= 2 RL draws each (balanced one-way random-effects
analysis of variance over seeds, ``one_way``):

    MSB = k var(seed means),  MSW = mean over seeds of the within-seed variance
    var(W) = max(0, (MSB - MSW) / k),  var(T) + var(E) = MSW,  var(T) = max(0, MSW - var(E))

The seed share var(W) / (var(W) + MSW) gets the exact interval of the balanced design: F = MSB / MSW follows
(1 + k theta) F(g - 1, g (k - 1)), theta = var(W) / MSW (Searle, Casella and McCulloch 1992, "Variance
Components", 3.5).

Evaluation size: var(E) falls as 1 / (eval prompts). Where var(E) is more than a quarter of the total, the
number of prompts that would bring it to a quarter is ``prompts x 3 var(E) / (var(W) + var(T))``; the MDE at
the same seeds is shown with the variance as measured and as it would be at that size.

Pure functions of ``RunData``; the page is ``markdown``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from gspo_bench import tables
from gspo_bench.reporting.frame import FINISHED
from gspo_bench.reporting.leaderboard import _param
from gspo_bench.reporting.paired import mde

LIFT_FLOOR = 10.0  # points: the lift the default must give every algorithm on every seed
EVAL_SHARE = 0.25  # the largest share of the variance the evaluation may take
HALF_KEYS = ("eval/pass1_even", "eval/pass1_odd")


@dataclass(frozen=True)
class Draw:
    """One FINISHED run, in points of greedy pass@1."""

    algo: str
    seed: str
    rl_seed: str  # the run's seed where train.rl_seed was not set
    start: float  # the warm start's score (step 0)
    final: float  # the last evaluation's
    halves: tuple[float, float] | None  # the last evaluation's two halves, where logged
    ws_steps: float | None = None  # the warm start's supervised steps
    ws_dev: float | None = None  # the warm start's greedy pass@1 on the dev split it was accepted on (points)

    @property
    def lift(self) -> float:
        return self.final - self.start


@dataclass(frozen=True)
class OneWay:
    """A balanced one-way random-effects analysis over ``groups`` seeds of ``k`` draws each."""

    groups: int
    k: int
    between: float  # var(W)
    within: float  # MSW = var(T) + var(E)
    share: float  # var(W) / (var(W) + within)
    share_ci: tuple[float, float]


@dataclass(frozen=True)
class Decomposition:
    """One quantity (an algorithm's lift, or a paired difference) split into its three variances."""

    label: str
    anova: OneWay
    eval_var: float | None  # var(E), from the halves; None where no run logged them
    eval_runs: int  # runs (or pairs) the var(E) estimate averages over

    @property
    def train_var(self) -> float:
        return max(0.0, self.anova.within - (self.eval_var or 0.0))

    @property
    def total(self) -> float:
        return self.anova.between + self.anova.within


def draws(runs) -> list[Draw]:
    """The FINISHED runs that have a step-0 and a final greedy pass@1, as ``Draw``s (points): the warm start and
    the final as the leaderboard reads them (the first and last evaluation of the history)."""
    out = []
    for r in runs:
        ev = r.history.get("eval/pass1", [])
        if r.status != FINISHED or not ev or ev[0][0] != 0:
            continue
        halves = tuple(100 * r.metrics[k] for k in HALF_KEYS) if all(k in r.metrics for k in HALF_KEYS) else None
        rl = r.params.get("train.rl_seed")  # unset: absent (older runs), or null as the config logs None
        dev = _param(r, "resolved.warmstart.dev_pass1")
        out.append(Draw(r.algo, r.seed, rl if rl and rl.isdigit() else r.seed, 100 * ev[0][1], 100 * ev[-1][1],
                        halves, _param(r, "resolved.warmstart.steps"), None if dev is None else 100 * dev))
    return out


def warm_start_links(ds: list[Draw]) -> list[list[str]]:
    """Does the warm start foretell its seed's lift? Per warm-start measure (its supervised steps, its dev and
    eval pass@1), Spearman's rank correlation with the seed's mean lift over its own-draw runs, and its p."""
    own = [d for d in ds if d.rl_seed == d.seed]
    seeds = sorted({d.seed for d in own})
    lift = [float(np.mean([d.lift for d in own if d.seed == s])) for s in seeds]
    first = {s: next(d for d in own if d.seed == s) for s in seeds}
    rows = []
    for label, get in (("warm-start steps", lambda d: d.ws_steps), ("dev pass@1 at acceptance", lambda d: d.ws_dev),
                       ("eval pass@1 (the warm start's score)", lambda d: d.start)):
        xs = [get(first[s]) for s in seeds]
        if len(seeds) < 4 or any(x is None for x in xs) or len(set(xs)) < 2:
            continue
        rho, p = stats.spearmanr(xs, lift)
        rows.append([label, str(len(seeds)), f"{rho:+.2f}", f"{p:.2f}"])
    return rows


def one_way(groups: list[list[float]], alpha: float = 0.05) -> OneWay | None:
    """Balanced one-way random effects over the groups with at least two values (each cut to the smallest such
    count, its first values kept); None with fewer than two such groups."""
    groups = [g for g in groups if len(g) >= 2]
    if len(groups) < 2:
        return None
    k = min(len(g) for g in groups)
    x = np.array([g[:k] for g in groups], dtype=float)
    n = len(x)
    # MSB = k var(group means); MSW = mean within-group variance
    msb = k * x.mean(1).var(ddof=1)
    msw = x.var(1, ddof=1).mean()
    between = max(0.0, (msb - msw) / k)
    share = between / (between + msw) if between + msw > 0 else 0.0
    if msw <= 0:
        return OneWay(n, k, between, msw, share, (share, share))
    f, d1, d2 = msb / msw, n - 1, n * (k - 1)
    # theta = var(W) / MSW in [(F / F_hi - 1) / k, (F / F_lo - 1) / k]; share = theta / (1 + theta)
    lo, hi = (max(0.0, (f / q - 1) / k) for q in (stats.f.ppf(1 - alpha / 2, d1, d2), stats.f.ppf(alpha / 2, d1, d2)))
    return OneWay(n, k, between, msw, share, (lo / (1 + lo), hi / (1 + hi)))


def _eval_var(halves: list[tuple[float, float]]) -> float | None:
    # var(E) = mean of (even - odd)^2 / 4 (the full score is the mean of two independent halves)
    return float(np.mean([(e - o) ** 2 / 4 for e, o in halves])) if halves else None


def _by_seed(items: dict[tuple[str, str], float]) -> list[list[float]]:
    """Values keyed (seed, rl_seed) grouped by seed, the seed's own draw first, then by rl_seed."""
    seeds: dict[str, list[tuple[bool, str, float]]] = {}
    for (seed, rl), v in items.items():
        seeds.setdefault(seed, []).append((rl != seed, rl, v))
    return [[v for *_, v in sorted(vs)] for _, vs in sorted(seeds.items())]


def decompose_lift(ds: list[Draw], algo: str) -> Decomposition | None:
    mine = [d for d in ds if d.algo == algo]
    anova = one_way(_by_seed({(d.seed, d.rl_seed): d.lift for d in mine}))
    halves = [d.halves for d in mine if d.halves]
    return None if anova is None else Decomposition(f"{algo}: lift", anova, _eval_var(halves), len(halves))


def decompose_pair(ds: list[Draw], algo: str, baseline: str) -> Decomposition | None:
    """d = final(algo) - final(baseline) over the (seed, rl_seed) both have."""
    a = {(d.seed, d.rl_seed): d for d in ds if d.algo == algo}
    b = {(d.seed, d.rl_seed): d for d in ds if d.algo == baseline}
    both = sorted(set(a) & set(b))
    anova = one_way(_by_seed({key: a[key].final - b[key].final for key in both}))
    # the difference's halves: (even_a - even_b) and (odd_a - odd_b)
    halves = [(a[key].halves[0] - b[key].halves[0], a[key].halves[1] - b[key].halves[1])
              for key in both if a[key].halves and b[key].halves]
    return None if anova is None else Decomposition(f"{algo} - {baseline}: final pass@1", anova, _eval_var(halves),
                                                    len(halves))


def eval_size_for(dec: Decomposition, prompts: int, share: float = EVAL_SHARE) -> int | None:
    """The eval prompts at which var(E) would be ``share`` of the total (var(E) scales as 1 / prompts); None
    without a var(E) estimate or where the rest of the variance is 0."""
    rest = dec.anova.between + dec.train_var
    if dec.eval_var is None or rest <= 0:
        return None
    # var(E) prompts / N' = share / (1 - share) x rest  =>  N' = prompts var(E) (1 - share) / (share rest)
    return math.ceil(prompts * dec.eval_var * (1 - share) / (share * rest))


def lift_table(ds: list[Draw], floor: float = LIFT_FLOOR) -> tuple[list[str], list[list[str]], list[str]]:
    """Per seed (its own RL draw) the lift of every algorithm, those under ``floor`` in bold; and the list of
    (algorithm, seed) under it."""
    algos = sorted({d.algo for d in ds})
    own = {(d.seed, d.algo): d for d in ds if d.rl_seed == d.seed}
    seeds = sorted({s for s, _ in own}, key=lambda s: (len(s), s))
    rows, low = [], []
    for s in seeds:
        cells = []
        for a in algos:
            d = own.get((s, a))
            if d is None:
                cells.append("-")
                continue
            cells.append(f"**{d.lift:+.1f}**" if d.lift < floor else f"{d.lift:+.1f}")
            if d.lift < floor:
                low.append(f"{a} seed {s} ({d.lift:+.1f})")
        start = next(d.start for (s2, _), d in own.items() if s2 == s)
        rows.append([s, f"{start:.1f}", *cells])
    return ["seed", "warm start", *algos], rows, low


def _pct(x: float, total: float) -> str:
    return f"{100 * x / total:.0f} %" if total > 0 else "-"


def decomposition_rows(decs: list[Decomposition]) -> list[list[str]]:
    rows = []
    for d in decs:
        t, a = d.total, d.anova
        ev = "-" if d.eval_var is None else f"{d.eval_var:.2f} ({_pct(d.eval_var, t)})"
        rows.append([d.label, f"{a.groups} x {a.k}", f"{math.sqrt(t):.2f}", f"{a.between:.2f} ({_pct(a.between, t)})",
                     f"[{100 * a.share_ci[0]:.0f} %, {100 * a.share_ci[1]:.0f} %]",
                     f"{d.train_var:.2f} ({_pct(d.train_var, t)})", ev])
    return rows


def mde_rows(decs: list[Decomposition], prompts: int, seeds: int, alpha: float = 0.05) -> list[list[str]]:
    """Per paired comparison: the MDE at ``seeds`` seeds with the variance as measured, and at the eval size
    that would bring var(E) to a quarter (unchanged where it is already at most a quarter)."""
    rows = []
    for d in decs:
        if d.eval_var is None:
            continue
        need = eval_size_for(d, prompts)
        now = mde(math.sqrt(d.total), seeds, alpha)
        if need is None or need <= prompts:
            rows.append([d.label, f"{_pct(d.eval_var, d.total)}", f"{prompts}", f"{now:.1f}", "(already at most a "
                         "quarter)"])
            continue
        after = d.anova.between + d.train_var + d.eval_var * prompts / need
        rows.append([d.label, f"{_pct(d.eval_var, d.total)}", f"{need}", f"{now:.1f}",
                     f"{mde(math.sqrt(after), seeds, alpha):.1f}"])
    return rows


def markdown(ds: list[Draw], baseline: str, prompts: int, meta: dict) -> str:
    """The page: per-seed lifts, then the variance split of each algorithm's lift and of each paired
    difference against ``baseline``, then the evaluation size."""
    algos = sorted({d.algo for d in ds})
    seeds = len({d.seed for d in ds})
    cols, rows, low = lift_table(ds)
    lifts = [x for a in algos if (x := decompose_lift(ds, a)) is not None]
    pairs = [x for a in algos if a != baseline and (x := decompose_pair(ds, a, baseline)) is not None]
    out = [f"# {meta['title']}", "", f"Made by `{meta['command']}` at commit `{meta['commit']}` ({meta['machine']}).",
           "", f"{len(ds)} FINISHED runs: {', '.join(f'{a} x {sum(d.algo == a for d in ds)}' for a in algos)}, "
           f"{seeds} seeds; lifts and finals in points of greedy pass@1.", "",
           f"## Lift per seed (final minus warm start, points of greedy pass@1; under {LIFT_FLOOR:g} in bold)", "",
           tables.markdown(cols, rows),
           (f"Under {LIFT_FLOOR:g} points: " + ", ".join(low) + ".") if low else
           f"No run here lifts by less than {LIFT_FLOOR:g} points ({sum(c != '-' for r in rows for c in r[2:])} "
           f"runs: each algorithm on the seeds it has a cell for)." if rows else
           "No seed has a run of its own RL draw (every run set `train.rl_seed` to another seed).", "",
           *(["Does the warm start foretell how far RL lifts it? Spearman's rank correlation of each warm-start "
              "measure with the seed's mean lift (over its algorithms):", "",
              tables.markdown(("warm-start measure", "seeds", "Spearman rho", "p"), links), ""]
             if (links := warm_start_links(ds)) else []),
           "## Where the variance comes from", "",
           "Variances in points^2 (share of the total in brackets): **seed** = what the seed fixes before RL "
           "(data, initial weights, warm start; for a paired difference, the seed's interaction with the "
           "algorithm), with the exact 95 % interval of its share; **training** = RL's own draws (`train.rl_seed`); "
           "**evaluation** = the greedy score's error from its finite eval prompts (from the halves of the eval "
           "set). seeds x draws: the balanced design used.", "",
           tables.markdown(("quantity", "seeds x draws", "sd", "seed", "seed share 95 % CI", "training",
                            "evaluation"), decomposition_rows(lifts + pairs)) if lifts + pairs else
           "No two seeds have two RL draws each: nothing to split (run the seeds again with `--set train.rl_seed=N`)."]
    mrows = mde_rows(pairs, prompts, seeds)
    if mrows:
        out += ["## Evaluation size", "",
                f"The evaluation's share of a paired difference's variance at {prompts} eval prompts, the prompts "
                f"that would bring it to a quarter (var(E) falls as 1 / prompts), and the MDE (two-sided paired t, "
                f"alpha 0.05, 80 % power) at {seeds} seeds, as measured and at that size.", "",
                tables.markdown(("comparison", "evaluation share", "eval prompts for a quarter", "MDE now (points)",
                                 "MDE at that size"), mrows)]
    return "\n".join(out).rstrip() + "\n"
