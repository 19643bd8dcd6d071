"""The claims of the sources (the GSPO paper and the Qwen team's article on it, the MiniMax-M1 paper for
CISPO, TRL's pull request adding GSPO-token, the R3 paper, the DAPO paper, and the papers of SAPO, VESPO, DPPO
and Dr. GRPO) and the miniature experiment that checks each one.

A claim is split into *parts*. A part is a per-seed paired difference

    d_s = sum_i sign_i * measure_i(run of term i at seed s)

over the seeds where every term has exactly one FINISHED run, and a *claimed region* R for the true mean of
``d_s``. Terms of one part may come from different experiments (a difference of differences across
scenarios): runs with the same seed start from the same warm start whenever their task, model and warm-start
settings agree, which holds for every pairing below (tiny-dense experiments with each other, tiny-moe with
tiny-moe). ``claims.verdict`` turns the part's 95 % t interval and R into reproduced / refuted / not decided.

Measures (``claims.measure``): ``final``, ``warm`` and ``at:S`` are greedy eval pass@1 in points (100 x) at
the last eval, the first eval (= the warm start) and step S; ``log10:KEY`` is log10 of the mean over steps of
metric KEY (so a difference of two is log10 of a ratio); ``mean:KEY`` the mean over steps of KEY; ``min:KEY``
its smallest value over the steps (a floor the run never went under).

The margin ``delta`` (points of pass@1) is the smallest difference treated as practically relevant: "at least
as well" means no worse than ``-delta``, "equal" means within ``+-delta``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gspo_bench.reporting import staleness_grid

INF = math.inf
ENTROPY_FLOOR = 0.1  # nats: the `entropy` preset's collapse.entropy_floor (tests/test_claims.py checks they agree)
DEFAULT_MARGIN = 3.0  # points of greedy pass@1; RL lifts it by 16-36 points on the default task

LOG_SESOI = 0.05  # log10 of a ratio: the smallest ratio of interest, 10^0.05 = 1.12x
ENTROPY_SESOI = 0.02  # nats of token entropy: the smallest gap of interest between two runs' lowest entropy

# the claims' own runs: every experiment named claims-* starts from the warm starts accepted on the dev split
# (never on the eval split pass@1 is read on), seed by seed as ``CAMPAIGN`` lists them
SEEDS = "0,1,2,3,4,5,6,7"  # the seeds of the claims' default-task experiments
STRESS_SEEDS = "0,1,2,3,4,5"  # the seeds of their stressed scenarios and of the default's stale/off-policy algorithms
OLD_SEEDS = "0,1,2"  # the experiments kept from before the dev split (`long`)
# The second round: three parts the first round left undecided were grown to a number of seeds fixed from the
# first round's sd (``claims --target-mde 3``), written here before any of the added runs: claim 1's default part
# (planner: 11 seeds) and claim 2's off-policy part (13) to 16, claim 7 (20) to 20. Each is then tested once, at
# its final seeds, as a fixed-size design. They were chosen, having seen the first round's results, as the
# cheapest to grow in one session (the default task and `offpolicy`, from dev-split warm starts); parts of the
# MoE, `long` and staleness claims the planner also sizes at 20 seeds or fewer wait for a later round.
ROUND2_DEFAULT = "8,9,10,11,12,13,14,15"  # grpo and gspo on the default task: 16 seeds in all
ROUND2_SPEED = "8,9,10,11,12,13,14,15,16,17,18,19"  # cispo and dapo without dynamic sampling: 20 in all
ROUND2_OFFPOLICY = "6,7,8,9,10,11,12,13,14,15"  # grpo and gspo under `offpolicy`: 16 in all
# The third round: the MoE claims (3, 4 and 5's MoE part) left the experiment kept from before the dev split
# for their own, claims-moe: the same grid (grpo, gspo and cispo under no replay, r3, r2 and TIS) from tiny-moe
# warm starts accepted on the dev split, at 10 seeds fixed here before any of its runs. The planner put the
# cheapest of claim 4's parts (gspo: r3 - tis) at 6 seeds from the kept runs' sd; 10 leaves room for the new
# warm starts' spread. Each part is tested once, at the 10 seeds.
ROUND3_MOE = "0,1,2,3,4,5,6,7,8,9"
ROUNDS = (SEEDS, STRESS_SEEDS, ROUND2_DEFAULT, ROUND2_SPEED, ROUND2_OFFPOLICY, ROUND3_MOE)
# the default preset's own settings when the claims ran, pinned: the default since moved to a linear decay
PINNED = "--set train.lr=2e-4 --set train.lr_schedule=constant"


def _run(args: str, seeds: str = SEEDS) -> str:
    return f"python -m gspo_bench run {args} --seed {seeds}"


# experiment -> (what it is, the commands that made its runs, in order)
EXPERIMENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "claims-default": (
        "the default preset: tiny-dense (Qwen3, 4 layers) on arith, warm start accepted on the dev split at "
        "40-43 %, 64 prompts x 8 samples, 40 RL steps, 4 minibatches, lr 2e-4; every algorithm from the same "
        "warm start per seed",
        (_run(f"--algos grpo,gspo,gspo_token,cispo,dapo,sapo --experiment claims-default {PINNED}"),
         _run(f"--algos vespo,dppo_tv,dppo_kl --experiment claims-default {PINNED}", STRESS_SEEDS),
         _run(f"--algos grpo,gspo --experiment claims-default {PINNED}", ROUND2_DEFAULT),
         _run(f"--algos cispo --experiment claims-default {PINNED}", ROUND2_SPEED))),
    "claims-dapo-ablation": (
        "DAPO on the default preset with one of its parts switched off, from the same warm starts as "
        "claims-default: dynamic sampling off (`rollout.dynamic_sampling=false`, tuning tag no-dynamic-sampling) "
        "or clip-higher off (eps_high 0.2 = eps_low, tuning tag no-clip-higher)",
        (_run(f"--algos dapo --experiment claims-dapo-ablation {PINNED} --set rollout.dynamic_sampling=false "
              "--set tuning=no-dynamic-sampling"),
         _run(f"--algos dapo --experiment claims-dapo-ablation {PINNED} --eps-high 0.2 --set tuning=no-clip-higher"),
         _run(f"--algos dapo --experiment claims-dapo-ablation {PINNED} --set rollout.dynamic_sampling=false "
              "--set tuning=no-dynamic-sampling", ROUND2_SPEED))),
    "claims-entropy": (
        "the `entropy` scenario (sampling temperature 0.3, lr 6e-4, 80 steps), where grpo's token entropy falls "
        "steadily; clip_cov and kl_cov with a covariance ratio of 2 % of the tokens (tuning tag cov-ratio-2pct; "
        "verl's 2e-4 selects about one token of a minibatch here), and grpo, from the same warm starts as "
        "claims-default",
        (_run("--preset entropy --algos grpo,clip_cov,kl_cov --experiment claims-entropy --set "
              "loss.clip_cov_ratio=0.02 --set loss.kl_cov_ratio=0.02 --set tuning=cov-ratio-2pct"),)),
    "claims-entropy-target": (
        "the `entropy` scenario with grpo and TRL's adaptive entropy bonus: target 0.2 nats, the coefficient "
        "stepping by 0.01 per optimiser step within [0, 1] (tuning tag entropy-target); same warm starts",
        (_run("--preset entropy --algos grpo --experiment claims-entropy-target --set loss.entropy_target=0.2 "
              "--set loss.entropy_coef_delta=0.01 --set tuning=entropy-target"),)),
    "claims-stale": (
        "the `stale` scenario: rollouts from the policy of 2 steps ago, ratios against the sampler's log-probs; "
        "same warm starts",
        (_run("--preset stale --algos grpo,gspo,vespo,dppo_tv,dppo_kl --experiment claims-stale", STRESS_SEEDS),)),
    "claims-offpolicy": (
        "the `offpolicy` scenario: the default with 16 minibatches (16 optimiser steps per rollout); same warm "
        "starts",
        (_run("--preset offpolicy --algos grpo,gspo,vespo,dppo_tv,dppo_kl --experiment claims-offpolicy",
              STRESS_SEEDS),
         _run("--preset offpolicy --algos grpo,gspo --experiment claims-offpolicy", ROUND2_OFFPOLICY))),
    "claims-hot": (
        "the `hot` scenario: learning rate 1.5e-3, 7.5x the constant 2e-4 the claims ran the default at; same "
        "warm starts",
        (_run("--preset hot --algos grpo,gspo,sapo --experiment claims-hot", STRESS_SEEDS),)),
    "claims-moe": (
        "tiny-moe (Qwen3-MoE, 8 experts, top-2) on arith, the default preset with its warm start accepted on "
        "the dev split, sampler in bfloat16 and training in float32, under Routing Replay none / r3 / r2 and "
        "TIS (cap 2)",
        (_run(f"--algos grpo,gspo,cispo --model tiny-moe --experiment claims-moe {PINNED} "
              "--set rollout.dtype=bfloat16 "
              "--set moe.routing_replay=R --set rollout.correction=C", ROUND3_MOE)
         + "  # (R, C) = (none, none), (r3, none), (r2, none), (none, tis)",)),
    "suite-long": (
        "the `long` scenario: arith_scratchpad, responses of 37-54 tokens (column-by-column working); warm "
        "starts from before the dev split",
        ("python -m gspo_bench suite --scenarios long --algos grpo,gspo,dr_grpo --seeds 3",)),
    "controls-default": (
        "the default preset, grpo with every token in the policy loss and with only the top 20 % of each "
        "minibatch's tokens by entropy (`loss.top_entropy_quantile=0.2`, tuning tag top-entropy-20); warm starts "
        "from before the dev split",
        (_run(f"--algos grpo --experiment controls-default {PINNED}"),
         _run(f"--algos grpo --experiment controls-default {PINNED} --set loss.top_entropy_quantile=0.2 "
              "--set tuning=top-entropy-20"))),
    "claims-truncation": (
        "the default preset with responses capped at 3 tokens (`rollout.max_new_tokens=3`, about 45 % of "
        "responses truncated), grpo with and without truncated responses masked out of the loss "
        "(`rollout.mask_truncated=true`; tuning tags cap-3 and cap-3-masked); same warm starts as claims-default",
        (_run(f"--algos grpo --experiment claims-truncation {PINNED} --set rollout.max_new_tokens=3 "
              "--set tuning=cap-3"),
         _run(f"--algos grpo --experiment claims-truncation {PINNED} --set rollout.max_new_tokens=3 "
              "--set rollout.mask_truncated=true --set tuning=cap-3-masked"))),
}
# the multi-turn claims' seeds: the `tools` scenario's first round, registered before any of its runs
TOOLS_SEEDS = "0,1,2,3,4,5,6,7"
EXPERIMENTS.update({
    "multiturn-tools": (
        "the `tools` scenario: tiny-dense on calc (three 2-digit numbers, two of + - *, at least one product), "
        "the model calling a calculator in the compact form ([37*58], answered =2146) and answering after up "
        "to 4 turns; warm start on the scripted solver's transcripts accepted on the dev split at 40-43 %, 32 "
        "prompts x 8 episodes, 30 RL steps, 4 minibatches, lr 4e-4 decayed linearly; every algorithm from the "
        "same warm start per seed",
        (f"python -m gspo_bench suite --scenarios tools --algos all --seed {TOOLS_SEEDS} --experiment-prefix "
         "multiturn --out results/multiturn",)),
    "claims-tools-tis": (
        "the `tools` scenario with the sampler in bfloat16 (training in float32: a real sampler/trainer "
        "mismatch), grpo with truncated importance sampling (cap 2) at the token level (tuning tag token-tis) "
        "or over the whole trajectory's model tokens (sequence-tis); same warm starts as multiturn-tools",
        (_run("--preset tools --algos grpo --experiment claims-tools-tis --set rollout.dtype=bfloat16 --set "
              "rollout.correction=tis --set rollout.correction_level=token --set tuning=token-tis", TOOLS_SEEDS),
         _run("--preset tools --algos grpo --experiment claims-tools-tis --set rollout.dtype=bfloat16 --set "
              "rollout.correction=tis --set rollout.correction_level=sequence --set tuning=sequence-tis",
              TOOLS_SEEDS))),
})
# the staleness grid's cells the claims read (the whole grid is ``staleness_grid``'s page)
STALENESS_CLAIMED = ("staleness-e0-naive", "staleness-e4-naive", "staleness-e8-naive", "staleness-e0-tis",
                     "staleness-e4-tis", "staleness-e0-m2po", "staleness-e8-m2po")
EXPERIMENTS.update({k: v for k, v in staleness_grid.experiments().items() if k in STALENESS_CLAIMED})


@dataclass(frozen=True)
class Term:
    """``sign x measure`` of the one FINISHED run of ``experiment`` whose tags include ``where``."""

    experiment: str
    where: tuple[tuple[str, str], ...]
    measure: str = "final"
    sign: int = 1


@dataclass(frozen=True)
class Part:
    label: str
    terms: tuple[Term, ...]
    region: tuple[float, float]  # the claimed region of the true mean difference, open interval (lo, hi)
    unit: str = "points"  # "points" (of pass@1), "log10" (of a ratio) or the raw metric
    decisive: bool = True  # False: shown as a mechanism reading, not used in the verdict


@dataclass(frozen=True)
class Curve:
    """A set of runs drawn as one curve (mean over seeds) in the claim's figure."""

    label: str
    experiment: str
    where: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    source: str
    design: str  # the miniature experiment, in words
    experiments: tuple[str, ...]
    parts: tuple[Part, ...]
    curves: tuple[Curve, ...]
    curve_metric: str = "eval/pass1"
    retired: str = ""  # why no miniature here can show the claim's mechanism: its parts are shown, none decides


def _w(algo: str, **tags: str) -> tuple[tuple[str, str], ...]:
    return (("algo", algo),) + tuple(tags.items())


def _diff(exp: str, a: tuple, b: tuple, measure: str = "final", measure_b: str | None = None) -> tuple[Term, ...]:
    """The terms of ``measure(a) - measure_b(b)`` in one experiment."""
    return (Term(exp, a, measure), Term(exp, b, measure_b or measure, -1))


def _did(exp: str, base: str, a: tuple, b: tuple, base_a: tuple, base_b: tuple) -> tuple[Term, ...]:
    """(a - b) in ``exp`` minus (a - b) in ``base``: how much more ``a`` leads under ``exp``'s stress."""
    return _diff(exp, a, b) + tuple(Term(t.experiment, t.where, t.measure, -t.sign)
                                    for t in _diff(base, base_a, base_b))


def claims(delta: float = DEFAULT_MARGIN) -> tuple[Claim, ...]:
    """Every claim, with its parts' regions drawn with margin ``delta`` (points): the smallest effect of
    interest, registered before the runs. "Better" is ahead by more than ``delta``, "at least as well" no worse
    than ``-delta``, "equal" within ``+-delta``, "at most" no more than ``+delta``; a ratio "above" or "below"
    is beyond 10^``LOG_SESOI``. No region is bounded at 0, so a null effect can refute a directional claim."""
    # regions (lo, hi) with their edges at the smallest effect of interest
    greater, at_least, equal, at_most = (delta, INF), (-delta, INF), (-delta, delta), (-INF, delta)
    log_above, log_below = (LOG_SESOI, INF), (-INF, -LOG_SESOI)
    d, m, lg = "claims-default", "claims-moe", "suite-long"
    stale, offp, hot, ent = "claims-stale", "claims-offpolicy", "claims-hot", "claims-entropy"
    dflt = {"preset": "default", "tuning": "default"}
    cov = {"tuning": "cov-ratio-2pct"}
    moe = {"none": {"routing_replay": "none", "correction": "none"},
           "r3": {"routing_replay": "r3", "correction": "none"},
           "r2": {"routing_replay": "r2", "correction": "none"},
           "tis": {"routing_replay": "none", "correction": "tis"}}
    no_dyn = _w("dapo", tuning="no-dynamic-sampling")
    return (
        Claim("clip", "GSPO clips about 100x more tokens than GRPO, and still learns at least as well.",
              "GSPO article (Qwen team), clipping-fraction figure: ~15 % of tokens vs ~0.13 %, on long reasoning "
              "responses",
              "the fraction of clipped tokens per step (mean over the steps, log10 ratio gspo / grpo) on `long` "
              "(37-54-token scratchpads, the one scenario with responses long enough for the article's setting; "
              "'about 100x' is read as within a factor of 3 of 100, log10 ratio in (1.5, 2.5)), and the final "
              "greedy pass@1 on the default task (at least as well: no worse than the margin). The default "
              "task's ratio (answers of ~3 tokens) is shown beside the verdict.",
              (lg, d),
              (Part("long: log10 clip-fraction ratio gspo / grpo",
                    _diff(lg, _w("gspo"), _w("grpo"), "log10:clip/frac"), (1.5, 2.5), "log10"),
               Part("default: final pass@1, gspo - grpo", _diff(d, _w("gspo", **dflt), _w("grpo", **dflt)),
                    at_least),
               Part("default: log10 clip-fraction ratio gspo / grpo",
                    _diff(d, _w("gspo", **dflt), _w("grpo", **dflt), "log10:clip/frac"), (1.5, 2.5), "log10",
                    decisive=False)),
              (Curve("default grpo", d, _w("grpo", **dflt)), Curve("default gspo", d, _w("gspo", **dflt)),
               Curve("long grpo", lg, _w("grpo")), Curve("long gspo", lg, _w("gspo"))),
              "clip/frac"),
        Claim("stability", "GSPO is more stable than GRPO under off-policy updates and long responses.",
              "GSPO article: token-level ratios accumulate noise over long responses and off-policy updates",
              "two stress scenarios: `offpolicy` (16 optimiser steps per rollout) and `long` (37-54-token "
              "scratchpad responses); final greedy pass@1, gspo - grpo per seed ('more stable' read as: ahead by "
              "more than the margin). Two related stresses are shown beside them, outside the verdict: `stale` "
              "rollouts and the `hot` learning rate.",
              (offp, lg, stale, hot),
              (Part("offpolicy: final pass@1, gspo - grpo", _diff(offp, _w("gspo"), _w("grpo")), greater),
               Part("long: final pass@1, gspo - grpo", _diff(lg, _w("gspo"), _w("grpo")), greater),
               Part("stale: final pass@1, gspo - grpo", _diff(stale, _w("gspo"), _w("grpo")), greater,
                    decisive=False),
               Part("hot: final pass@1, gspo - grpo", _diff(hot, _w("gspo"), _w("grpo")), greater,
                    decisive=False)),
              (Curve("offpolicy grpo", offp, _w("grpo")), Curve("offpolicy gspo", offp, _w("gspo")),
               Curve("long grpo", lg, _w("grpo")), Curve("long gspo", lg, _w("gspo")),
               Curve("hot grpo", hot, _w("grpo")), Curve("hot gspo", hot, _w("gspo")))),
        Claim("moe-replay", "GRPO on MoE needs Routing Replay, and GSPO does not.",
              "GSPO article: GRPO on Qwen3-30B-A3B does not converge without Routing Replay; GSPO does",
              "tiny-moe with a bf16 sampler (routing noise between sampler and trainer), Routing Replay r3 vs "
              "none; final greedy pass@1. 'Needs' is read as: without replay GRPO gains no more than the "
              "margin over its warm start, and replay lifts it by more than the margin; 'GSPO does not' as: "
              "replay lifts GSPO by no more than the margin.",
              (m,),
              (Part("grpo without replay: final - warm start", _diff(m, _w("grpo", **moe["none"]),
                                                                     _w("grpo", **moe["none"]), "final", "warm"),
                    at_most),
               Part("grpo: r3 - none", _diff(m, _w("grpo", **moe["r3"]), _w("grpo", **moe["none"])), greater),
               Part("gspo: r3 - none", _diff(m, _w("gspo", **moe["r3"]), _w("gspo", **moe["none"])), at_most)),
              (Curve("grpo none", m, _w("grpo", **moe["none"])), Curve("grpo r3", m, _w("grpo", **moe["r3"])),
               Curve("gspo none", m, _w("gspo", **moe["none"])), Curve("gspo r3", m, _w("gspo", **moe["r3"])))),
        Claim("r3", "R3 beats R2 and TIS for MoE under a bf16 sampler.",
              "Rollout Routing Replay (R3), arXiv 2510.11370: replaying "
              "the sampler's experts removes the routing part of the mismatch that R2 and TIS leave",
              "tiny-moe, bf16 sampler: r3 vs r2 and r3 vs TIS per algorithm (grpo, gspo, cispo); final greedy "
              "pass@1 ('beats': ahead by more than the margin), plus the mean sampler/trainer KL "
              "(`mismatch/kl`, log10 ratio) as a mechanism reading.",
              (m,),
              tuple(Part(f"{a}: r3 - {o}", _diff(m, _w(a, **moe["r3"]), _w(a, **moe[o])), greater)
                    for a in ("grpo", "gspo", "cispo") for o in ("r2", "tis"))
              + tuple(Part(f"{a}: log10 mismatch/kl r3 / {o}", _diff(m, _w(a, **moe["r3"]), _w(a, **moe[o]),
                                                                       "log10:mismatch/kl"), log_below, "log10",
                           decisive=False) for a in ("grpo", "gspo", "cispo") for o in ("r2", "tis")),
              tuple(Curve(f"grpo {o}", m, _w("grpo", **moe[o])) for o in ("r3", "r2", "tis"))),
        Claim("mismatch", "The sequence ratio tolerates sampler/trainer mismatch better than token ratios do.",
              "GSPO article and analysis: a sequence-level ratio averages per-token noise",
              "gspo's lead over grpo under a mismatched sampler minus its lead without one: `stale` (rollouts "
              "from 2 steps ago) vs the default (tiny-dense, same warm starts); and gspo - grpo under the bf16 "
              "MoE sampler without replay (no matched fp32 MoE control, so that part is a plain difference). "
              "'Better' is read as: by more than the margin.",
              (stale, d, m),
              (Part("stale vs default: (gspo - grpo) on stale - (gspo - grpo) on default",
                    _did(stale, d, _w("gspo"), _w("grpo"), _w("gspo", **dflt), _w("grpo", **dflt)), greater),
               Part("moe bf16, no replay: gspo - grpo", _diff(m, _w("gspo", **moe["none"]),
                                                               _w("grpo", **moe["none"])), greater)),
              (Curve("stale grpo", stale, _w("grpo")), Curve("stale gspo", stale, _w("gspo")),
               Curve("default grpo", d, _w("grpo", **dflt)), Curve("default gspo", d, _w("gspo", **dflt)))),
        Claim("gspo-token", "GSPO-token equals GSPO when every token carries its sequence's advantage.",
              "GSPO article (GSPO-token section) and the TRL pull request adding it",
              "the default comparison: gspo_token (group advantages are per sequence here) vs gspo; final "
              "greedy pass@1 within the margin. The losses' values and gradients are equal by construction "
              "(tests/test_losses.py); this checks that training outcomes agree.",
              (d,),
              (Part("final pass@1, gspo_token - gspo", _diff(d, _w("gspo_token", **dflt), _w("gspo", **dflt)),
                    equal),),
              (Curve("gspo", d, _w("gspo", **dflt)), Curve("gspo_token", d, _w("gspo_token", **dflt)))),
        Claim("cispo-speed", "CISPO reaches DAPO's score in about half the steps.",
              "MiniMax-M1 report, as the CISPO review summarises it: DAPO's performance in 50 % of the steps",
              "cispo's greedy pass@1 after 20 steps against DAPO's after 40 (the end), matched on the samples "
              "drawn per step: DAPO without dynamic sampling, which draws 64 x 8 per step as cispo does (full "
              "DAPO draws extra batches to refill the groups it drops, so its steps cost more; it is shown beside "
              "the verdict). 'Reaches' is read as: no worse than the margin.",
              (d, "claims-dapo-ablation"),
              (Part("cispo at step 20 - dapo (no dynamic sampling) at step 40",
                    (Term(d, _w("cispo", **dflt), "at:20"), Term("claims-dapo-ablation", no_dyn, sign=-1)),
                    at_least),
               Part("cispo at step 20 - dapo (full) at step 40",
                    _diff(d, _w("cispo", **dflt), _w("dapo", **dflt), "at:20", "final"), at_least,
                    decisive=False)),
              (Curve("dapo", d, _w("dapo", **dflt)), Curve("dapo, no dynamic sampling", "claims-dapo-ablation",
                                                           no_dyn),
               Curve("cispo", d, _w("cispo", **dflt)))),
        Claim("dapo-parts", "DAPO's dynamic sampling and clip-higher each help.",
              "DAPO paper (Yu et al. 2025, arXiv 2503.14476), its ablation table: each technique adds AIME points; "
              "clip-higher is introduced to keep the policy's entropy from collapsing",
              "full DAPO (claims-default) against DAPO with one part switched off (claims-dapo-ablation), same "
              "warm start and prompts per seed; final greedy pass@1. 'Helps' is read as: full DAPO ahead by more "
              "than the margin. The mean token entropy over the run is shown for clip-higher, as the mechanism "
              "the paper gives.",
              (d, "claims-dapo-ablation"),
              (Part("full - no dynamic sampling: final pass@1",
                    (Term(d, _w("dapo", **dflt)), Term("claims-dapo-ablation", no_dyn, sign=-1)), greater),
               Part("full - no clip-higher: final pass@1",
                    (Term(d, _w("dapo", **dflt)), Term("claims-dapo-ablation", _w("dapo", tuning="no-clip-higher"),
                                                       sign=-1)), greater),
               Part("full - no clip-higher: mean policy/entropy",
                    (Term(d, _w("dapo", **dflt), "mean:policy/entropy"),
                     Term("claims-dapo-ablation", _w("dapo", tuning="no-clip-higher"), "mean:policy/entropy", -1)),
                    (0.0, INF), "policy/entropy", decisive=False)),
              (Curve("dapo", d, _w("dapo", **dflt)),
               Curve("dapo, no dynamic sampling", "claims-dapo-ablation", no_dyn),
               Curve("dapo, no clip-higher", "claims-dapo-ablation", _w("dapo", tuning="no-clip-higher")))),
        Claim("sapo", "SAPO's soft gate keeps more learning signal than hard clipping, and is at least as stable "
              "as GSPO.",
              "SAPO paper (Gao et al. 2025, Soft Adaptive Policy Optimization, Qwen team, arXiv 2511.20347): a "
              "smooth, temperature-controlled gate in place of the hard clip damps off-policy tokens instead of "
              "zeroing their gradient, and trains more stably than GSPO and GRPO",
              "sapo vs grpo on the default task (final greedy pass@1; 'more learning signal' is read as: sapo "
              "ends ahead by more than the margin), and sapo vs gspo under the `hot` learning rate, where the "
              "full suite saw grpo collapse and gspo hold ('at least as stable': no worse than the margin). The "
              "mean `clip/frac` (log10 ratio) is the mechanism reading: for sapo it counts the tokens whose gate "
              "damps the gradient by more than half, for grpo the tokens clipped.",
              (d, hot),
              (Part("default: final pass@1, sapo - grpo", _diff(d, _w("sapo", **dflt), _w("grpo", **dflt)),
                    greater),
               Part("hot: final pass@1, sapo - gspo", _diff(hot, _w("sapo"), _w("gspo")), at_least),
               Part("default: log10 clip-fraction ratio sapo / grpo",
                    _diff(d, _w("sapo", **dflt), _w("grpo", **dflt), "log10:clip/frac"), log_below, "log10",
                    decisive=False)),
              (Curve("default grpo", d, _w("grpo", **dflt)), Curve("default sapo", d, _w("sapo", **dflt)),
               Curve("hot gspo", hot, _w("gspo")), Curve("hot sapo", hot, _w("sapo")))),
        Claim("vespo-stale", "VESPO holds up where off-policy staleness grows.",
              "VESPO paper (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693): a smooth "
              "weight of the sequence's importance ratio in place of clipping keeps training stable as the "
              "rollouts go off policy",
              "vespo's lead over grpo under `stale` rollouts (from the policy of 2 steps ago) minus its lead in "
              "the default (tiny-dense, same warm starts), and vespo - grpo under `offpolicy` (16 optimiser "
              "steps per rollout); final greedy pass@1, 'holds up' read as: ahead by more than the margin.",
              (stale, d, offp),
              (Part("stale vs default: (vespo - grpo) on stale - (vespo - grpo) on default",
                    _did(stale, d, _w("vespo"), _w("grpo"), _w("vespo", **dflt), _w("grpo", **dflt)), greater),
               Part("offpolicy: final pass@1, vespo - grpo", _diff(offp, _w("vespo"), _w("grpo")), greater)),
              (Curve("stale grpo", stale, _w("grpo")), Curve("stale vespo", stale, _w("vespo")),
               Curve("offpolicy grpo", offp, _w("grpo")), Curve("offpolicy vespo", offp, _w("vespo")))),
        Claim("dppo-stale", "DPPO's divergence-based trust region holds up where off-policy staleness grows.",
              "DPPO paper (Rethinking the Trust Region in LLM Reinforcement Learning, arXiv 2602.04879): a trust "
              "region on how far the token's probability moved (total variation or binary KL) in place of "
              "PPO's ratio clip keeps training stable off policy",
              "as for VESPO, for both divergences (dppo_tv, dppo_kl): each one's lead over grpo under `stale` "
              "minus its lead in the default, and each one - grpo under `offpolicy`; final greedy pass@1.",
              (stale, d, offp),
              tuple(p for a in ("dppo_tv", "dppo_kl") for p in (
                  Part(f"stale vs default: ({a} - grpo) on stale - ({a} - grpo) on default",
                       _did(stale, d, _w(a), _w("grpo"), _w(a, **dflt), _w("grpo", **dflt)), greater),
                  Part(f"offpolicy: final pass@1, {a} - grpo", _diff(offp, _w(a), _w("grpo")), greater))),
              (Curve("stale grpo", stale, _w("grpo")), Curve("stale dppo_tv", stale, _w("dppo_tv")),
               Curve("stale dppo_kl", stale, _w("dppo_kl")))),
        Claim("dr-grpo-length", "Dropping GRPO's std and length normalisation (Dr. GRPO) removes its length bias: "
              "wrong answers stop growing longer.",
              "Understanding R1-Zero-Like Training: A Critical Perspective (Liu et al. 2025, arXiv 2503.20783): "
              "GRPO's per-response length normalisation penalises long wrong answers less, so they grow; Dr. "
              "GRPO drops it and the std scaling, keeping accuracy while wrong answers stay short",
              "dr_grpo vs grpo on `long`: the mean length of the wrong responses (log10 ratio), the final greedy "
              "pass@1 and the mean length of all responses, shown as readings.",
              (lg,),
              (Part("long: log10 wrong-answer length ratio dr_grpo / grpo",
                    _diff(lg, _w("dr_grpo"), _w("grpo"), "log10:response/length_wrong_mean"), log_below, "log10"),
               Part("long: final pass@1, dr_grpo - grpo", _diff(lg, _w("dr_grpo"), _w("grpo")), at_least),
               Part("long: log10 response-length ratio dr_grpo / grpo",
                    _diff(lg, _w("dr_grpo"), _w("grpo"), "log10:response/length_mean"), log_below, "log10",
                    decisive=False)),
              (Curve("long grpo", lg, _w("grpo")), Curve("long dr_grpo", lg, _w("dr_grpo"))),
              "response/length_wrong_mean",
              retired="no built-in task lets a response's length vary freely: `long`'s scratchpad fixes every "
                      "response at 37-54 tokens and the other tasks answer in about 3, so a length bias has no "
                      "room to show"),
        Claim("top-entropy", "Training only on the 20 % of tokens with the highest entropy learns at least as well "
              "as training on all of them.",
              "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM "
              "Reasoning (Wang et al. 2025, arXiv 2506.01939), as TRL's `top_entropy_quantile` implements it: the "
              "policy gradient of the top 20 % of tokens by entropy matches or beats the full gradient",
              "grpo with `loss.top_entropy_quantile=0.2` against grpo on every token, on the default task; final "
              "greedy pass@1 and the mean token entropy (log10 ratio), shown as readings.",
              ("controls-default",),
              (Part("default: final pass@1, top-20 % tokens - all tokens",
                    _diff("controls-default", _w("grpo", tuning="top-entropy-20"), _w("grpo", **dflt)), at_least),
               Part("default: log10 mean-entropy ratio, top-20 % / all",
                    _diff("controls-default", _w("grpo", tuning="top-entropy-20"), _w("grpo", **dflt),
                          "log10:policy/entropy"), (-INF, INF), "log10", decisive=False)),
              (Curve("grpo, all tokens", "controls-default", _w("grpo", **dflt)),
               Curve("grpo, top-20 % tokens", "controls-default", _w("grpo", tuning="top-entropy-20"))),
              retired="the paper's mechanism is the few high-entropy 'forking' tokens of long reasoning; answers "
                      "here are about 3 tokens, so the mask leaves most responses without any policy-gradient "
                      "token and `long`'s scratchpads are written digit by digit, with no forks to find"),
        Claim("cov", "Clip-Cov and KL-Cov keep the policy's entropy above GRPO's, and learn no worse.",
              "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models (Cui et al. 2025, "
              "arXiv 2505.22617): entropy falls as the covariance of log-probability and advantage drives it; "
              "clipping (Clip-Cov) or penalising (KL-Cov) the few tokens of highest covariance keeps it up and "
              "improves accuracy. Implemented as verl does, at a ratio that selects tokens here",
              "the `entropy` scenario (grpo's token entropy falls to half and less): clip_cov and kl_cov "
              "against grpo, same warm start per seed, each selecting 2 % of the tokens (verl's default 2e-4 "
              "selects about one token of a minibatch of a few thousand here, too few to move anything); the "
              "mean token entropy over the run (log10 ratio, 'above' read as: a ratio above 10^0.05 = 1.12) and "
              "the final greedy pass@1 (no worse than the margin).",
              (ent,),
              tuple(p for a in ("clip_cov", "kl_cov") for p in (
                  Part(f"entropy: log10 mean-entropy ratio {a} / grpo",
                       _diff(ent, _w(a, **cov), _w("grpo", **cov), "log10:policy/entropy"), log_above, "log10"),
                  Part(f"entropy: final pass@1, {a} - grpo", _diff(ent, _w(a, **cov), _w("grpo", **cov)),
                       at_least))),
              (Curve("grpo", ent, _w("grpo", **cov)), Curve("clip_cov", ent, _w("clip_cov", **cov)),
               Curve("kl_cov", ent, _w("kl_cov", **cov))),
              "policy/entropy"),
        Claim("entropy-target", "An entropy bonus with an adaptive target prevents the entropy collapse.",
              "TRL's adaptive entropy control (`entropy_coef` with a target entropy and min/max bounds, after "
              "the Skywork-OR1 report's adaptive entropy coefficient): the coefficient rises while entropy is "
              "under the target, so entropy cannot collapse",
              "the `entropy` scenario: grpo with the adaptive bonus (target 0.2 nats, about the warm start's "
              "entropy at this temperature) against grpo, same warm start per seed. 'Prevents' is read as: the "
              "lowest token entropy over the run stays above the scenario's collapse floor (0.1 nats) and above "
              f"grpo's by more than {ENTROPY_SESOI:g} nats. Beside the verdict: grpo's own lowest entropy (under "
              "the floor: the collapse the scenario is for) and what the bonus costs in final pass@1.",
              ("claims-entropy-target", ent),
              (Part("entropy: lowest token entropy, grpo + target",
                    (Term("claims-entropy-target", _w("grpo", tuning="entropy-target"), "min:policy/entropy"),),
                    (ENTROPY_FLOOR, INF), "policy/entropy"),
               Part("entropy: lowest token entropy, grpo + target - grpo",
                    (Term("claims-entropy-target", _w("grpo", tuning="entropy-target"), "min:policy/entropy"),
                     Term(ent, _w("grpo", **cov), "min:policy/entropy", -1)), (ENTROPY_SESOI, INF),
                    "policy/entropy"),
               Part("entropy: lowest token entropy, grpo",
                    (Term(ent, _w("grpo", **cov), "min:policy/entropy"),), (-INF, ENTROPY_FLOOR),
                    "policy/entropy", decisive=False),
               Part("entropy: final pass@1, grpo + target - grpo",
                    (Term("claims-entropy-target", _w("grpo", tuning="entropy-target")),
                     Term(ent, _w("grpo", **cov), sign=-1)), at_least, decisive=False)),
              (Curve("grpo", ent, _w("grpo", **cov)),
               Curve("grpo + adaptive entropy bonus", "claims-entropy-target", _w("grpo", tuning="entropy-target"))),
              "policy/entropy"),
        Claim("mask-truncated", "Masking truncated responses out of the loss does not hurt learning.",
              "TRL's `mask_truncated_completions`, after DAPO's overlong filtering (Yu et al. 2025, arXiv "
              "2503.14476), which masks the loss of truncated samples and reports that it stabilises training",
              "grpo with `rollout.mask_truncated=true` against grpo on the default task with responses capped at "
              "3 tokens (`rollout.max_new_tokens=3`), where about 45 % of responses hit the cap (a 3-digit answer "
              "without its end token: often right, but truncated), same warm start per seed; final greedy "
              "pass@1 (no worse than the margin). The mean fraction of truncated responses, the ones the mask "
              "takes out, is the mechanism reading. The earlier design on `long` (truncation-long) truncated "
              "0.5 % of responses, too few for the mask to change a run.",
              ("claims-truncation",),
              (Part("capped: final pass@1, masked - unmasked",
                    _diff("claims-truncation", _w("grpo", tuning="cap-3-masked"), _w("grpo", tuning="cap-3")),
                    at_least),
               Part("capped: mean truncated fraction, unmasked",
                    (Term("claims-truncation", _w("grpo", tuning="cap-3"), "mean:response/truncated_frac"),),
                    (-INF, INF), "response/truncated_frac", decisive=False)),
              (Curve("grpo", "claims-truncation", _w("grpo", tuning="cap-3")),
               Curve("grpo, truncated masked", "claims-truncation", _w("grpo", tuning="cap-3-masked")))),
        *staleness_claims(greater, at_least),
        *tools_claims(greater),
    )


def tools_claims(greater: tuple[float, float]) -> tuple[Claim, ...]:
    """The multi-turn claims, on the `tools` scenario (registered with ``TOOLS_SEEDS`` before any of its runs
    was read). Both are paired by seed: a seed's runs share one warm start and prompt order."""
    mt, tis = "multiturn-tools", "claims-tools-tis"
    below = (-INF, -greater[0])  # falls behind: below by more than the margin
    return (
        Claim("gspo-multiturn", "On multi-turn tool use, GSPO's sequence-level ratio beats GRPO's token-level one.",
              "GSPO (Zheng et al. 2025, arXiv 2507.18071) and the Qwen team's account of it: token-level ratios "
              "add noise token by token, and as multi-turn agentic RL becomes common that accumulation should "
              "grow, widening the sequence-level ratio's advantage",
              "every algorithm on calc with a calculator tool, over up to 4 model turns, about a third of each "
              "trajectory's response written by the environment (never in the loss); gspo's ratio is the "
              "geometric mean over the model's tokens of the whole trajectory. gspo against grpo, final greedy "
              "pass@1, 'beats' read as: ahead by more than the margin.",
              (mt,),
              (Part("calc: final pass@1, gspo - grpo", _diff(mt, _w("gspo"), _w("grpo")), greater),),
              tuple(Curve(a, mt, _w(a)) for a in ("grpo", "gspo"))),
        Claim("vcpo-seq-tis", "On multi-turn tool use, sequence-level importance correction falls behind.",
              "VCPO (arXiv 2602.17616): sequence-level truncated importance sampling collapses on multi-turn "
              "tool use, where a finer-grained correction keeps training",
              "grpo on calc with the sampler in bfloat16 and truncated importance sampling (cap 2), the weight "
              "taken over the whole trajectory's model tokens (sequence) against per token (token); final greedy "
              "pass@1, 'falls behind' read as: below the token-level run by more than the margin.",
              (tis,),
              (Part("calc, bf16 sampler: final pass@1, sequence TIS - token TIS",
                    _diff(tis, _w("grpo", tuning="sequence-tis"), _w("grpo", tuning="token-tis")), below),),
              tuple(Curve(f"grpo, {lvl} TIS", tis, _w("grpo", tuning=f"{lvl}-tis")) for lvl in ("token", "sequence"))),
    )


def staleness_claims(greater: tuple[float, float], at_least: tuple[float, float]) -> tuple[Claim, ...]:
    """The asynchronous-training claims, on the staleness grid (``staleness_grid``; registered with its first
    round's seeds, ``staleness_grid.SEEDS``, before any of its runs was read). Every part is paired by seed across
    the grid's experiments: each seed's cells share one warm start and prompt order."""
    def e(eta: int, corr: str) -> str:
        return staleness_grid.experiment(eta, corr)

    def across(a: tuple[str, tuple], b: tuple[str, tuple]) -> tuple[Term, ...]:
        """final pass@1 of ``a`` = (experiment, tags) minus that of ``b``."""
        return Term(a[0], a[1]), Term(b[0], b[1], sign=-1)

    def did(hi: int, lo: int, corr: str, x: str, y: str) -> tuple[Term, ...]:
        """(x - y) at eta ``hi`` minus (x - y) at eta ``lo``, under ``corr``."""
        return (_diff(e(hi, corr), _w(x), _w(y))
                + tuple(Term(t.experiment, t.where, t.measure, -t.sign) for t in _diff(e(lo, corr), _w(x), _w(y))))

    below = (-INF, at_least[0])  # falls: below by more than the margin
    grpo = _w("grpo")
    return (
        Claim("decoupled-ppo", "Decoupled PPO holds its score at a staleness of 4 steps, where naive PPO falls.",
              "AReaL (Fu et al. 2025, arXiv 2505.24298), staleness table (R1-Distill-1.5B, AIME24): naive PPO "
              "42.0 on policy and 23.3 at a staleness of 4; decoupled PPO 42.2 at 4",
              "grpo (PPO's token ratio clip) on the default task with rollouts 4 RL steps stale (the deterministic "
              "lag), naive (ratios against the stale sampler) against decoupled (recomputed proximal log-probs, "
              "the behaviour weight truncated at 2 per token), each against itself on policy (eta 0); final "
              "greedy pass@1. 'Holds' is read as: no worse than the margin below its own on-policy score; "
              "'falls': below its own on-policy score by more than the margin; decoupled ahead of naive at "
              "eta 4 by more than the margin.",
              (e(4, "tis"), e(4, "naive"), e(0, "tis"), e(0, "naive")),
              (Part("eta 4: final pass@1, decoupled - naive (grpo)",
                    across((e(4, "tis"), grpo), (e(4, "naive"), grpo)), greater),
               Part("decoupled: final pass@1, eta 4 - eta 0 (grpo)",
                    across((e(4, "tis"), grpo), (e(0, "tis"), grpo)), at_least),
               Part("naive: final pass@1, eta 4 - eta 0 (grpo)",
                    across((e(4, "naive"), grpo), (e(0, "naive"), grpo)), below)),
              tuple(Curve(f"grpo {c}, eta {eta}", e(eta, c), grpo) for c in ("naive", "tis") for eta in (0, 4))),
        Claim("m2po-stale", "M2PO stays stable with stale data: it holds its on-policy score.",
              "M2PO (Second-Moment Trust Policy Optimization, arXiv 2510.01161): masking the few tokens of "
              "largest second moment of the log-ratio to the sampler keeps training stable with data many model "
              "updates stale, matching on-policy accuracy",
              "grpo and cispo with M2PO's mask (threshold 0.04, recomputed proximal log-probs) at the grid's "
              "largest staleness (8 RL steps) against the same at eta 0; final greedy pass@1, 'holds' read as: "
              "no worse than the margin. Beside the verdict: M2PO against the naive form at eta 8.",
              (e(8, "m2po"), e(0, "m2po"), e(8, "naive")),
              tuple(Part(f"m2po: final pass@1, eta 8 - eta 0 ({a})",
                         across((e(8, "m2po"), _w(a)), (e(0, "m2po"), _w(a))), at_least)
                    for a in ("grpo", "cispo"))
              + tuple(Part(f"eta 8: final pass@1, m2po - naive ({a})",
                           across((e(8, "m2po"), _w(a)), (e(8, "naive"), _w(a))), greater, decisive=False)
                      for a in ("grpo", "cispo")),
              tuple(Curve(f"{a} m2po, eta {eta}", e(eta, "m2po"), _w(a)) for a in ("grpo", "cispo")
                    for eta in (0, 8))),
        Claim("trust-region-async", "With stale samples, prefer a loss with a trust region.",
              "Tinker cookbook (Thinking Machines), asynchronous and off-policy RL: losses that bound how far a "
              "step moves the policy from the sampler's (a clipped ratio) stay stable where plain importance "
              "weighting does not",
              "at the grid's largest staleness (8 RL steps), naive (ratios against the stale sampler): grpo (PPO's "
              "clip, a trust region on the ratio) against cispo (its importance weight clipped and detached, "
              "every token keeping its gradient: no trust region); final greedy pass@1, 'prefer' read as: ahead "
              "by more than the margin. Beside the verdict: how much of that lead staleness made (the same "
              "difference at eta 8 minus at eta 0).",
              (e(8, "naive"), e(0, "naive")),
              (Part("eta 8 naive: final pass@1, grpo - cispo", _diff(e(8, "naive"), grpo, _w("cispo")), greater),
               Part("naive: (grpo - cispo) at eta 8 - (grpo - cispo) at eta 0", did(8, 0, "naive", "grpo", "cispo"),
                    greater, decisive=False)),
              tuple(Curve(f"{a}, eta 8", e(8, "naive"), _w(a)) for a in ("grpo", "cispo"))),
        Claim("gspo-stale", "GSPO's sequence ratio tolerates stale samples better than token ratios.",
              "GSPO article (Qwen team): one ratio per sequence, the geometric mean of its tokens', is less noisy "
              "than token ratios off policy, and stabilises training where token-level ratios collapse",
              "naive (ratios against the stale sampler), gspo against grpo: the lead gspo gains as the samples "
              "grow 8 RL steps stale, (gspo - grpo) at eta 8 minus (gspo - grpo) at eta 0, each seed's cells from "
              "one warm start; final greedy pass@1, 'better' read as: ahead by more than the margin. Beside the "
              "verdict: the same at eta 4.",
              (e(8, "naive"), e(4, "naive"), e(0, "naive")),
              (Part("naive: (gspo - grpo) at eta 8 - (gspo - grpo) at eta 0", did(8, 0, "naive", "gspo", "grpo"),
                    greater),
               Part("naive: (gspo - grpo) at eta 4 - (gspo - grpo) at eta 0", did(4, 0, "naive", "gspo", "grpo"),
                    greater, decisive=False)),
              tuple(Curve(f"{a}, eta {eta}", e(eta, "naive"), _w(a)) for a in ("grpo", "gspo") for eta in (0, 8))),
    )


def table_comparison(part: Part) -> tuple[str, dict, dict] | None:
    """``(experiment, a, b)`` when ``part`` is one comparison of the paired tables: final pass@1 of the runs
    tagged ``a`` minus that of the runs tagged ``b``, in one experiment; None otherwise."""
    if len(part.terms) != 2:
        return None
    a, b = part.terms
    if a.experiment != b.experiment or (a.measure, b.measure) != ("final", "final") or (a.sign, b.sign) != (1, -1):
        return None
    return a.experiment, dict(a.where), dict(b.where)


def registered(specs: tuple[Claim, ...]) -> dict[tuple, tuple[float, float]]:
    """(experiment, a's tags, b's tags) -> the region the claims registered for that paired-table comparison
    (decisive parts of claims not retired). One comparison has one region: two claims registering different
    regions for it is a ValueError naming both (the pages would give it two verdicts)."""
    out: dict[tuple, tuple[float, float]] = {}
    who: dict[tuple, str] = {}
    for c in specs:
        for p in c.parts:
            got = table_comparison(p) if p.decisive and not c.retired else None
            if got is None:
                continue
            exp, a, b = got
            key = (exp, tuple(sorted(a.items())), tuple(sorted(b.items())))
            mirror = (exp, key[2], key[1])
            if mirror in out and out[mirror] != (-p.region[1], -p.region[0]):  # b - a registered elsewhere
                raise ValueError(f"claims {who[mirror]} and {c.key!r} register different regions for one comparison "
                                 f"({p.label} in {exp}, once each way round): {out[mirror]} and {p.region}")
            if key in out and out[key] != p.region:
                raise ValueError(f"claims {who[key]} and {c.key!r} register different regions for one comparison "
                                 f"({p.label} in {exp}): {out[key]} and {p.region}")
            out[key] = p.region
            who.setdefault(key, repr(c.key))
    return out


def region_lookup(experiment: str, delta: float = DEFAULT_MARGIN):
    """The paired tables' ``regions`` for ``experiment`` (``pairing.Regions``): given the run tags of a compared
    cell and of its baseline, the region a claim registered for that comparison, or None. A registration
    matches when its two tag sets are within the cells' tags and pin every tag in which the cells differ; a
    table that compares the two cells the other way round (none - r3 where the claim says r3 - none) gets the
    mirrored region, so the comparison's verdict is the same whichever way a page subtracts."""
    mine = [(dict(a), dict(b), region) for (exp, a, b), region in registered(claims(delta)).items()
            if exp == experiment]

    def matches(cell: dict, base: dict, a: dict, b: dict) -> bool:
        differ = {k for k in cell.keys() | base.keys() if cell.get(k) != base.get(k)}
        return (all(cell.get(k) == v for k, v in a.items()) and all(base.get(k) == v for k, v in b.items())
                and differ <= (a.keys() & b.keys()))

    def lookup(cell: dict, base: dict) -> tuple[float, float] | None:
        for a, b, (lo, hi) in mine:
            if matches(cell, base, a, b):
                return lo, hi
            if matches(cell, base, b, a):
                # the same comparison the other way round: cell - base = -(a - b), in the mirrored region
                return -hi, -lo
        return None

    return lookup


def sequence_edges(experiment: str, algos, baseline: str) -> dict[str, float]:
    """Per algorithm of ``algos`` whose comparison with ``baseline`` in ``experiment`` a claim registers with one
    edge, that edge in pass@1 units: what ``suite --until-decided`` decides it against (``sequential.edge_of``),
    so that its sequential verdict and the fixed-n pages test the same region."""
    from gspo_bench.reporting.sequential import edge_of

    lookup = region_lookup(experiment)
    edges = {a: edge_of(lookup({"algo": a}, {"algo": baseline})) for a in algos if a != baseline}
    return {a: e for a, e in edges.items() if e is not None}
