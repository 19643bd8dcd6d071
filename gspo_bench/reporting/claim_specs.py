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

INF = math.inf
ENTROPY_FLOOR = 0.1  # nats: the `entropy` preset's collapse.entropy_floor (tests/test_claims.py checks they agree)
DEFAULT_MARGIN = 3.0  # points of greedy pass@1; RL lifts it by 16-36 points on the default task

# the suite's cells the claims read, per scenario: the algorithms the claims compare there and no more (the full
# suite, every scenario x algorithm, is ``suite --algos all``)
SUITE_ALGOS = {"hot": "grpo,gspo,sapo", "stale": "grpo,gspo,vespo,dppo_tv,dppo_kl",
               "offpolicy": "grpo,gspo,vespo,dppo_tv,dppo_kl", "long": "grpo,gspo,dr_grpo",
               "entropy": "grpo,clip_cov,kl_cov"}
SUITE_SEEDS = {"entropy": 8}  # seeds of a scenario's cells where not the suite's default 3
EIGHT = "0,1,2,3,4,5,6,7"
LONG_SEEDS = "0,1,2,3"  # the truncation experiment's seeds: a `long` run takes about 5 minutes here


def suite_command(scenario: str, algos: str) -> str:
    """The suite invocation that makes ``algos``' cells of ``scenario`` (3 seeds unless ``SUITE_SEEDS``)."""
    return f"python -m gspo_bench suite --scenarios {scenario} --algos {algos} --seeds {SUITE_SEEDS.get(scenario, 3)}"


# experiment -> (what it is, the commands that made its runs, in order)
EXPERIMENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "arith-default": (
        "the default preset: tiny-dense (Qwen3, 4 layers) on arith, warm start to 40-43 %, 64 prompts x 8 "
        "samples, 40 RL steps, 4 minibatches, lr 2e-4; every algorithm from the same warm start per seed",
        ("python -m gspo_bench run --algos all --seed 0,1,2,3,4,5,6,7 --experiment arith-default",)),
    "moe-stabilisers": (
        "tiny-moe (Qwen3-MoE, 8 experts, top-2) on arith, default preset, sampler in bfloat16 and training in "
        "float32, under Routing Replay none / r3 / r2 and TIS (cap 2)",
        ("python -m gspo_bench run --algos grpo,gspo,cispo --model tiny-moe --seed 0,1,2 --experiment "
         "moe-stabilisers --set rollout.dtype=bfloat16 --set moe.routing_replay=R --set rollout.correction=C  "
         "# (R, C) = (none, none), (r3, none), (r2, none), (none, tis)",)),
    "dapo-ablation": (
        "DAPO on the default preset with one of its parts switched off, from the same warm starts as "
        "arith-default: dynamic sampling off (`rollout.dynamic_sampling=false`, tuning tag no-dynamic-sampling) "
        "or clip-higher off (eps_high 0.2 = eps_low, tuning tag no-clip-higher)",
        ("python -m gspo_bench run --algos dapo --seed 0,1,2,3,4,5,6,7 --experiment dapo-ablation "
         "--set rollout.dynamic_sampling=false --set tuning=no-dynamic-sampling",
         "python -m gspo_bench run --algos dapo --seed 0,1,2,3,4,5,6,7 --experiment dapo-ablation --eps-high 0.2 "
         "--set tuning=no-clip-higher")),
    "suite-offpolicy": (
        "the `offpolicy` scenario: the default with 16 minibatches (16 optimiser steps per rollout)",
        (suite_command("offpolicy", SUITE_ALGOS["offpolicy"]),)),
    "suite-long": (
        "the `long` scenario: arith_scratchpad, responses of 37-54 tokens (column-by-column working)",
        (suite_command("long", SUITE_ALGOS["long"]),)),
    "suite-stale": (
        "the `stale` scenario: rollouts from the policy of 2 steps ago, ratios against the sampler's log-probs",
        (suite_command("stale", SUITE_ALGOS["stale"]),)),
    "suite-hot": (
        "the `hot` scenario: learning rate 1.5e-3, 7.5x the default",
        (suite_command("hot", SUITE_ALGOS["hot"]),)),
    "controls-default": (
        "the default preset (as arith-default, same warm starts), grpo with every token in the policy loss and "
        "with only the top 20 % of each minibatch's tokens by entropy (`loss.top_entropy_quantile=0.2`, tuning "
        "tag top-entropy-20)",
        (f"python -m gspo_bench run --algos grpo --seed {EIGHT} --experiment controls-default",
         f"python -m gspo_bench run --algos grpo --seed {EIGHT} --experiment controls-default "
         "--set loss.top_entropy_quantile=0.2 --set tuning=top-entropy-20")),
    "suite-entropy": (
        "the `entropy` scenario: sampling temperature 0.3 and learning rate 6e-4 (3x the default), where grpo's "
        "token entropy falls steadily; its collapse detector's entropy floor is 0.1 nats",
        (suite_command("entropy", SUITE_ALGOS["entropy"]),)),
    "entropy-target": (
        "the `entropy` scenario with grpo and TRL's adaptive entropy bonus: target 0.2 nats, the coefficient "
        "stepping by 0.01 per optimiser step within [0, 1] (tuning tag entropy-target); same warm starts as "
        "suite-entropy",
        (f"python -m gspo_bench run --preset entropy --algos grpo --seed {EIGHT} --experiment entropy-target "
         "--set loss.entropy_target=0.2 --set loss.entropy_coef_delta=0.01 --set tuning=entropy-target",)),
    "truncation-long": (
        "the `long` scenario (arith_scratchpad, 37-54-token responses, at most 56 new tokens), grpo with and "
        "without truncated responses masked out of the loss (`rollout.mask_truncated=true`, tuning tag "
        "mask-truncated)",
        (f"python -m gspo_bench run --preset long --algos grpo --seed {LONG_SEEDS} --experiment truncation-long",
         f"python -m gspo_bench run --preset long --algos grpo --seed {LONG_SEEDS} --experiment truncation-long "
         "--set rollout.mask_truncated=true --set tuning=mask-truncated")),
}


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
    """Every claim, with its parts' regions drawn with margin ``delta`` (points)."""
    greater, at_least, equal, at_most = (0.0, INF), (-delta, INF), (-delta, delta), (-INF, delta)
    d, m = "arith-default", "moe-stabilisers"
    dflt = {"preset": "default", "tuning": "default"}
    lng = {"preset": "long", "tuning": "default"}
    moe = {"none": {"routing_replay": "none", "correction": "none"},
           "r3": {"routing_replay": "r3", "correction": "none"},
           "r2": {"routing_replay": "r2", "correction": "none"},
           "tis": {"routing_replay": "none", "correction": "tis"}}
    return (
        Claim("clip", "GSPO clips about 100x more tokens than GRPO, and still learns at least as well.",
              "GSPO article (Qwen team), clipping-fraction figure: ~15 % of tokens vs ~0.13 %, on long reasoning "
              "responses",
              "the fraction of clipped tokens per step (mean over 40 steps) and the final greedy pass@1, gspo vs "
              "grpo from the same warm start per seed, on the default task (answers of ~3 tokens) and on `long` "
              "(37-54-token scratchpads, closer to the article's setting). 'About 100x' is read as within a "
              "factor of 3 of 100 (log10 ratio in (1.5, 2.5)).",
              (d, "suite-long"),
              (Part("default: log10 clip-fraction ratio gspo / grpo",
                    _diff(d, _w("gspo", **dflt), _w("grpo", **dflt), "log10:clip/frac"), (1.5, 2.5), "log10"),
               Part("long: log10 clip-fraction ratio gspo / grpo",
                    _diff("suite-long", _w("gspo"), _w("grpo"), "log10:clip/frac"), (1.5, 2.5), "log10"),
               Part("default: final pass@1, gspo - grpo", _diff(d, _w("gspo", **dflt), _w("grpo", **dflt)),
                    at_least),
               Part("long: final pass@1, gspo - grpo", _diff("suite-long", _w("gspo"), _w("grpo")), at_least)),
              (Curve("default grpo", d, _w("grpo", **dflt)), Curve("default gspo", d, _w("gspo", **dflt)),
               Curve("long grpo", "suite-long", _w("grpo")), Curve("long gspo", "suite-long", _w("gspo"))),
              "clip/frac"),
        Claim("stability", "GSPO is more stable than GRPO under off-policy updates and long responses.",
              "GSPO article: token-level ratios accumulate noise over long responses and off-policy updates",
              "two stress scenarios of `suite`: `offpolicy` (16 optimiser steps per rollout) and `long` "
              "(37-54-token scratchpad responses); final greedy pass@1, gspo - grpo per seed. Two related "
              "stresses are shown beside them, outside the verdict: `stale` rollouts and the `hot` learning rate.",
              ("suite-offpolicy", "suite-long", "suite-stale", "suite-hot"),
              (Part("offpolicy: final pass@1, gspo - grpo", _diff("suite-offpolicy", _w("gspo"), _w("grpo")),
                    greater),
               Part("long: final pass@1, gspo - grpo", _diff("suite-long", _w("gspo"), _w("grpo")), greater),
               Part("stale: final pass@1, gspo - grpo", _diff("suite-stale", _w("gspo"), _w("grpo")), greater,
                    decisive=False),
               Part("hot: final pass@1, gspo - grpo", _diff("suite-hot", _w("gspo"), _w("grpo")), greater,
                    decisive=False)),
              (Curve("offpolicy grpo", "suite-offpolicy", _w("grpo")),
               Curve("offpolicy gspo", "suite-offpolicy", _w("gspo")),
               Curve("long grpo", "suite-long", _w("grpo")), Curve("long gspo", "suite-long", _w("gspo")),
               Curve("hot grpo", "suite-hot", _w("grpo")), Curve("hot gspo", "suite-hot", _w("gspo")))),
        Claim("moe-replay", "GRPO on MoE needs Routing Replay, and GSPO does not.",
              "GSPO article: GRPO on Qwen3-30B-A3B does not converge without Routing Replay; GSPO does",
              "tiny-moe with a bf16 sampler (routing noise between sampler and trainer), Routing Replay r3 vs "
              "none; final greedy pass@1. 'Needs' is read as: without replay GRPO gains no more than the "
              "margin over its warm start, and replay lifts it.",
              (m,),
              (Part("grpo without replay: final - warm start", _diff(m, _w("grpo", **moe["none"]),
                                                                     _w("grpo", **moe["none"]), "final", "warm"),
                    at_most),
               Part("grpo: r3 - none", _diff(m, _w("grpo", **moe["r3"]), _w("grpo", **moe["none"])), greater),
               Part("gspo: none - r3", _diff(m, _w("gspo", **moe["none"]), _w("gspo", **moe["r3"])), at_least)),
              (Curve("grpo none", m, _w("grpo", **moe["none"])), Curve("grpo r3", m, _w("grpo", **moe["r3"])),
               Curve("gspo none", m, _w("gspo", **moe["none"])), Curve("gspo r3", m, _w("gspo", **moe["r3"])))),
        Claim("r3", "R3 beats R2 and TIS for MoE under a bf16 sampler.",
              "Rollout Routing Replay (R3), arXiv 2510.11370: replaying "
              "the sampler's experts removes the routing part of the mismatch that R2 and TIS leave",
              "tiny-moe, bf16 sampler: r3 vs r2 and r3 vs TIS per algorithm (grpo, gspo, cispo); final greedy "
              "pass@1, plus the mean sampler/trainer KL (`mismatch/kl`, log10 ratio) as a mechanism reading.",
              (m,),
              tuple(Part(f"{a}: r3 - {o}", _diff(m, _w(a, **moe["r3"]), _w(a, **moe[o])), greater)
                    for a in ("grpo", "gspo", "cispo") for o in ("r2", "tis"))
              + tuple(Part(f"{a}: log10 mismatch/kl r3 / {o}", _diff(m, _w(a, **moe["r3"]), _w(a, **moe[o]),
                                                                       "log10:mismatch/kl"), (-INF, 0.0), "log10",
                           decisive=False) for a in ("grpo", "gspo", "cispo") for o in ("r2", "tis")),
              tuple(Curve(f"grpo {o}", m, _w("grpo", **moe[o])) for o in ("r3", "r2", "tis"))),
        Claim("mismatch", "The sequence ratio tolerates sampler/trainer mismatch better than token ratios do.",
              "GSPO article and analysis: a sequence-level ratio averages per-token noise",
              "gspo's lead over grpo under a mismatched sampler minus its lead without one: `stale` (rollouts "
              "from 2 steps ago) vs the default (tiny-dense, same warm starts); and gspo - grpo under the bf16 "
              "MoE sampler without replay (no matched fp32 MoE control, so that part is a plain difference).",
              ("suite-stale", d, m),
              (Part("stale vs default: (gspo - grpo) - (gspo - grpo)",
                    _did("suite-stale", d, _w("gspo"), _w("grpo"), _w("gspo", **dflt), _w("grpo", **dflt)),
                    greater),
               Part("moe bf16, no replay: gspo - grpo", _diff(m, _w("gspo", **moe["none"]),
                                                               _w("grpo", **moe["none"])), greater)),
              (Curve("stale grpo", "suite-stale", _w("grpo")), Curve("stale gspo", "suite-stale", _w("gspo")),
               Curve("default grpo", d, _w("grpo", **dflt)), Curve("default gspo", d, _w("gspo", **dflt)))),
        Claim("gspo-token", "GSPO-token equals GSPO when every token carries its sequence's advantage.",
              "GSPO article (GSPO-token section) and the TRL pull request adding it",
              "the default comparison: gspo_token (group advantages are per sequence here) vs gspo; final "
              "greedy pass@1. The losses' values and gradients are equal by construction (tests/test_losses.py); "
              "this checks that training outcomes agree within the margin.",
              (d,),
              (Part("final pass@1, gspo_token - gspo", _diff(d, _w("gspo_token", **dflt), _w("gspo", **dflt)),
                    equal),),
              (Curve("gspo", d, _w("gspo", **dflt)), Curve("gspo_token", d, _w("gspo_token", **dflt)))),
        Claim("cispo-speed", "CISPO reaches DAPO's score in about half the steps.",
              "MiniMax-M1 report, as the CISPO review summarises it: DAPO's performance in 50 % of the steps",
              "the default comparison: cispo's greedy pass@1 after 20 steps vs dapo's after 40 (the end), "
              "per seed.",
              (d,),
              (Part("cispo at step 20 - dapo at step 40", _diff(d, _w("cispo", **dflt), _w("dapo", **dflt),
                                                                 "at:20", "final"), at_least),),
              (Curve("dapo", d, _w("dapo", **dflt)), Curve("cispo", d, _w("cispo", **dflt)))),
        Claim("dapo-parts", "DAPO's dynamic sampling and clip-higher each help.",
              "DAPO paper (Yu et al. 2025, arXiv 2503.14476), its ablation table: each technique adds AIME points; "
              "clip-higher is introduced to keep the policy's entropy from collapsing",
              "full DAPO (arith-default) against DAPO with one part switched off (dapo-ablation), same warm start "
              "and prompts per seed; final greedy pass@1. 'Helps' is read as: full DAPO ahead. The mean token "
              "entropy over the run is shown for clip-higher, as the mechanism the paper gives.",
              (d, "dapo-ablation"),
              (Part("full - no dynamic sampling: final pass@1",
                    (Term(d, _w("dapo", **dflt)), Term("dapo-ablation", _w("dapo", tuning="no-dynamic-sampling"),
                                                       sign=-1)), greater),
               Part("full - no clip-higher: final pass@1",
                    (Term(d, _w("dapo", **dflt)), Term("dapo-ablation", _w("dapo", tuning="no-clip-higher"),
                                                       sign=-1)), greater),
               Part("full - no clip-higher: mean policy/entropy",
                    (Term(d, _w("dapo", **dflt), "mean:policy/entropy"),
                     Term("dapo-ablation", _w("dapo", tuning="no-clip-higher"), "mean:policy/entropy", -1)),
                    (0.0, INF), "policy/entropy", decisive=False)),
              (Curve("dapo", d, _w("dapo", **dflt)),
               Curve("dapo, no dynamic sampling", "dapo-ablation", _w("dapo", tuning="no-dynamic-sampling")),
               Curve("dapo, no clip-higher", "dapo-ablation", _w("dapo", tuning="no-clip-higher")))),
        Claim("sapo", "SAPO's soft gate keeps more learning signal than hard clipping, and is at least as stable "
              "as GSPO.",
              "SAPO paper (Gao et al. 2025, Soft Adaptive Policy Optimization, Qwen team, arXiv 2511.20347): a "
              "smooth, temperature-controlled gate in place of the hard clip damps off-policy tokens instead of "
              "zeroing their gradient, and trains more stably than GSPO and GRPO",
              "sapo vs grpo on the default task (final greedy pass@1; 'more learning signal' is read as: sapo "
              "ends ahead), and sapo vs gspo under the `hot` learning rate, where the full suite saw grpo "
              "collapse and gspo hold ('at least as stable': no worse than the margin). The mean `clip/frac` "
              "(log10 ratio) is the "
              "mechanism reading: for sapo it counts the tokens whose gate damps the gradient by more than half, "
              "for grpo the tokens clipped.",
              (d, "suite-hot"),
              (Part("default: final pass@1, sapo - grpo", _diff(d, _w("sapo", **dflt), _w("grpo", **dflt)),
                    greater),
               Part("hot: final pass@1, sapo - gspo", _diff("suite-hot", _w("sapo"), _w("gspo")), at_least),
               Part("default: log10 clip-fraction ratio sapo / grpo",
                    _diff(d, _w("sapo", **dflt), _w("grpo", **dflt), "log10:clip/frac"), (-INF, 0.0), "log10",
                    decisive=False)),
              (Curve("default grpo", d, _w("grpo", **dflt)), Curve("default sapo", d, _w("sapo", **dflt)),
               Curve("hot gspo", "suite-hot", _w("gspo")), Curve("hot sapo", "suite-hot", _w("sapo")))),
        Claim("vespo-stale", "VESPO holds up where off-policy staleness grows.",
              "VESPO paper (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693): a smooth "
              "weight of the sequence's importance ratio in place of clipping keeps training stable as the "
              "rollouts go off policy",
              "vespo's lead over grpo under `stale` rollouts (from the policy of 2 steps ago) minus its lead in "
              "the default (tiny-dense, same warm starts), and vespo - grpo under `offpolicy` (16 optimiser "
              "steps per rollout); final greedy pass@1.",
              ("suite-stale", d, "suite-offpolicy"),
              (Part("stale vs default: (vespo - grpo) - (vespo - grpo)",
                    _did("suite-stale", d, _w("vespo"), _w("grpo"), _w("vespo", **dflt), _w("grpo", **dflt)),
                    greater),
               Part("offpolicy: final pass@1, vespo - grpo", _diff("suite-offpolicy", _w("vespo"), _w("grpo")),
                    greater)),
              (Curve("stale grpo", "suite-stale", _w("grpo")), Curve("stale vespo", "suite-stale", _w("vespo")),
               Curve("offpolicy grpo", "suite-offpolicy", _w("grpo")),
               Curve("offpolicy vespo", "suite-offpolicy", _w("vespo")))),
        Claim("dppo-stale", "DPPO's divergence-based trust region holds up where off-policy staleness grows.",
              "DPPO paper (Rethinking the Trust Region in LLM Reinforcement Learning, arXiv 2602.04879): a trust "
              "region on how far the token's probability moved (total variation or binary KL) in place of "
              "PPO's ratio clip keeps training stable off policy",
              "as for VESPO, for both divergences (dppo_tv, dppo_kl): each one's lead over grpo under `stale` "
              "minus its lead in the default, and each one - grpo under `offpolicy`; final greedy pass@1.",
              ("suite-stale", d, "suite-offpolicy"),
              tuple(p for a in ("dppo_tv", "dppo_kl") for p in (
                  Part(f"stale vs default: ({a} - grpo) - ({a} - grpo)",
                       _did("suite-stale", d, _w(a), _w("grpo"), _w(a, **dflt), _w("grpo", **dflt)), greater),
                  Part(f"offpolicy: final pass@1, {a} - grpo", _diff("suite-offpolicy", _w(a), _w("grpo")),
                       greater))),
              (Curve("stale grpo", "suite-stale", _w("grpo")), Curve("stale dppo_tv", "suite-stale", _w("dppo_tv")),
               Curve("stale dppo_kl", "suite-stale", _w("dppo_kl")))),
        Claim("dr-grpo-length", "Dropping GRPO's std and length normalisation (Dr. GRPO) removes its length bias: "
              "wrong answers stop growing longer.",
              "Understanding R1-Zero-Like Training: A Critical Perspective (Liu et al. 2025, arXiv 2503.20783): "
              "GRPO's per-response length normalisation penalises long wrong answers less, so they grow; Dr. "
              "GRPO drops it and the std scaling, keeping accuracy while wrong answers stay short",
              "dr_grpo vs grpo on `long`, the one scenario with answers longer than a few tokens (its "
              "scratchpad format fixes them at 37-54 tokens, so a length bias has little room here): the mean over "
              "steps of the mean length of the wrong responses (`response/length_wrong_mean`, log10 "
              "ratio; 'stop growing longer' is read as: shorter under dr_grpo), the final greedy pass@1 (no "
              "worse than the margin), and the mean length of all responses as a mechanism reading.",
              ("suite-long",),
              (Part("long: log10 wrong-answer length ratio dr_grpo / grpo",
                    _diff("suite-long", _w("dr_grpo"), _w("grpo"), "log10:response/length_wrong_mean"),
                    (-INF, 0.0), "log10"),
               Part("long: final pass@1, dr_grpo - grpo", _diff("suite-long", _w("dr_grpo"), _w("grpo")),
                    at_least),
               Part("long: log10 response-length ratio dr_grpo / grpo",
                    _diff("suite-long", _w("dr_grpo"), _w("grpo"), "log10:response/length_mean"), (-INF, 0.0),
                    "log10", decisive=False)),
              (Curve("long grpo", "suite-long", _w("grpo")), Curve("long dr_grpo", "suite-long", _w("dr_grpo"))),
              "response/length_wrong_mean"),
        Claim("top-entropy", "Training only on the 20 % of tokens with the highest entropy learns at least as well "
              "as training on all of them.",
              "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM "
              "Reasoning (Wang et al. 2025, arXiv 2506.01939), as TRL's `top_entropy_quantile` implements it: the "
              "policy gradient of the top 20 % of tokens by entropy matches or beats the full gradient",
              "grpo with `loss.top_entropy_quantile=0.2` (the mask keeps the tokens whose entropy reaches the "
              "minibatch's 80th percentile) against grpo on every token, on the default task, same warm start and "
              "prompts per seed; final greedy pass@1. Answers here are about 3 tokens long, so the mask leaves "
              "most responses without a policy-gradient term; the mean token entropy (log10 ratio) is the "
              "mechanism reading.",
              ("controls-default",),
              (Part("default: final pass@1, top-20 % tokens - all tokens",
                    _diff("controls-default", _w("grpo", tuning="top-entropy-20"), _w("grpo", **dflt)), at_least),
               Part("default: log10 mean-entropy ratio, top-20 % / all",
                    _diff("controls-default", _w("grpo", tuning="top-entropy-20"), _w("grpo", **dflt),
                          "log10:policy/entropy"), (-INF, INF), "log10", decisive=False)),
              (Curve("grpo, all tokens", "controls-default", _w("grpo", **dflt)),
               Curve("grpo, top-20 % tokens", "controls-default", _w("grpo", tuning="top-entropy-20")))),
        Claim("cov", "Clip-Cov and KL-Cov keep the policy's entropy above GRPO's, and learn no worse.",
              "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models (Cui et al. 2025, "
              "arXiv 2505.22617): entropy falls as the covariance of log-probability and advantage drives it; "
              "clipping (Clip-Cov) or penalising (KL-Cov) the few tokens of highest covariance keeps it up and "
              "improves accuracy. Implemented with verl's defaults",
              "the `entropy` scenario (grpo's token entropy falls to half and less): clip_cov and kl_cov "
              "against grpo, same warm start per seed; the mean token entropy over the run (log10 ratio, "
              "'above' read as: ratio above 1) and the final greedy pass@1 (no worse than the margin). verl's "
              "default ratio, 2e-4 of the tokens, is 1 token of a minibatch here (a few thousand tokens).",
              ("suite-entropy",),
              tuple(p for a in ("clip_cov", "kl_cov") for p in (
                  Part(f"entropy: log10 mean-entropy ratio {a} / grpo",
                       _diff("suite-entropy", _w(a), _w("grpo"), "log10:policy/entropy"), (0.0, INF), "log10"),
                  Part(f"entropy: final pass@1, {a} - grpo", _diff("suite-entropy", _w(a), _w("grpo")),
                       at_least))),
              (Curve("grpo", "suite-entropy", _w("grpo")), Curve("clip_cov", "suite-entropy", _w("clip_cov")),
               Curve("kl_cov", "suite-entropy", _w("kl_cov"))),
              "policy/entropy"),
        Claim("entropy-target", "An entropy bonus with an adaptive target prevents the entropy collapse.",
              "TRL's adaptive entropy control (`entropy_coef` with a target entropy and min/max bounds, after "
              "the Skywork-OR1 report's adaptive entropy coefficient): the coefficient rises while entropy is "
              "under the target, so entropy cannot collapse",
              "the `entropy` scenario: grpo with the adaptive bonus (target 0.2 nats, about the warm start's "
              "entropy at this temperature) against grpo, same warm start per seed. 'Prevents' is read as: the "
              "lowest token entropy over the run stays above the scenario's collapse floor (0.1 nats) and above "
              "grpo's. Beside the verdict: grpo's own lowest entropy (under the floor: the collapse the "
              "scenario is for) and what the bonus costs in final pass@1.",
              ("entropy-target", "suite-entropy"),
              (Part("entropy: lowest token entropy, grpo + target",
                    (Term("entropy-target", _w("grpo", tuning="entropy-target"), "min:policy/entropy"),),
                    (ENTROPY_FLOOR, INF), "policy/entropy"),
               Part("entropy: lowest token entropy, grpo + target - grpo",
                    (Term("entropy-target", _w("grpo", tuning="entropy-target"), "min:policy/entropy"),
                     Term("suite-entropy", _w("grpo"), "min:policy/entropy", -1)), (0.0, INF), "policy/entropy"),
               Part("entropy: lowest token entropy, grpo",
                    (Term("suite-entropy", _w("grpo"), "min:policy/entropy"),), (-INF, ENTROPY_FLOOR),
                    "policy/entropy", decisive=False),
               Part("entropy: final pass@1, grpo + target - grpo",
                    (Term("entropy-target", _w("grpo", tuning="entropy-target")),
                     Term("suite-entropy", _w("grpo"), sign=-1)), at_least, decisive=False)),
              (Curve("grpo", "suite-entropy", _w("grpo")),
               Curve("grpo + adaptive entropy bonus", "entropy-target", _w("grpo", tuning="entropy-target"))),
              "policy/entropy"),
        Claim("mask-truncated", "Masking truncated responses out of the loss does not hurt learning on long "
              "responses.",
              "TRL's `mask_truncated_completions`, after DAPO's overlong filtering (Yu et al. 2025, arXiv "
              "2503.14476), which masks the loss of truncated samples and reports that it stabilises training",
              "grpo with `rollout.mask_truncated=true` against grpo on `long` (scratchpad answers of 37-54 "
              "tokens under a 56-token cap), same warm start per seed; final greedy pass@1 (no worse than the "
              "margin). The mean fraction of truncated responses, the ones the mask takes out, is the mechanism "
              "reading: the smaller it is, the less the two runs can differ.",
              ("truncation-long",),
              (Part("long: final pass@1, masked - unmasked",
                    _diff("truncation-long", _w("grpo", tuning="mask-truncated"), _w("grpo", **lng)), at_least),
               Part("long: mean truncated fraction, unmasked",
                    (Term("truncation-long", _w("grpo", **lng), "mean:response/truncated_frac"),), (-INF, INF),
                    "response/truncated_frac", decisive=False)),
              (Curve("grpo", "truncation-long", _w("grpo", **lng)),
               Curve("grpo, truncated masked", "truncation-long", _w("grpo", tuning="mask-truncated")))),
    )
