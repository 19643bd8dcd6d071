"""``reporting/claims.py`` and ``claims``: measures, pairing across experiments, the region tests and their
families by hand, the paired tables' rows, retired claims, the page."""

import math

import pytest
from mlflow_fakes import log_run, new_store, one_line
from scipy.stats import t as student_t
from scipy.stats import ttest_1samp

from gspo_bench.cli.main import main
from gspo_bench.config import ConfigError
from gspo_bench.reporting import claims as cl
from gspo_bench.reporting.claim_specs import (EXPERIMENTS, LOG_SESOI, ROUNDS, Claim, Part, Term, claims, region_lookup,
                                              registered, table_comparison)
from gspo_bench.reporting.frame import RunData


def _run(algo: str, seed: int, evals, status: str = "FINISHED", **tags) -> RunData:
    hist = {"eval/pass1": list(evals), "clip/frac": [(1, 0.02), (2, 0.04)], "mismatch/kl": [(1, 1e-4), (2, 3e-4)]}
    return RunData(f"{algo}{seed}", status, {"algo": algo, "seed": str(seed), **tags}, {}, {}, hist)


def test_measures_by_hand():
    r = _run("grpo", 0, [(0, 0.40), (10, 0.55), (20, 0.61)])
    assert cl.measure(r, "final") == pytest.approx(61.0)
    assert cl.measure(r, "warm") == pytest.approx(40.0)
    assert cl.measure(r, "at:10") == pytest.approx(55.0)
    assert cl.measure(r, "at:15") is None  # no eval at that step
    assert cl.measure(r, "log10:clip/frac") == pytest.approx(math.log10(0.03))  # log10 of the mean 0.03
    assert cl.measure(r, "mean:mismatch/kl") == pytest.approx(2e-4)
    assert cl.measure(r, "min:clip/frac") == pytest.approx(0.02)  # the smaller of 0.02 and 0.04
    assert cl.measure(r, "min:ratio/max") is None
    assert cl.measure(r, "mean:ratio/max") is None
    with pytest.raises(ValueError, match="unknown measure"):
        cl.measure(r, "median:clip/frac")


@pytest.mark.parametrize("ci, region, want", [
    ((0.5, 2.0), (0.0, math.inf), cl.REPRODUCED),
    ((-2.0, -0.1), (0.0, math.inf), cl.REFUTED),
    ((-1.0, 1.0), (0.0, math.inf), cl.UNDECIDED),
    ((-2.9, 2.9), (-3.0, 3.0), cl.REPRODUCED),
    ((1.0, 4.0), (-3.0, 3.0), cl.UNDECIDED),
    ((3.0, 4.0), (-3.0, 3.0), cl.REFUTED),  # touching the open edge is outside
    (None, (0.0, math.inf), cl.UNDECIDED),
])
def test_verdict_against_the_claimed_region(ci, region, want):
    assert cl.verdict(ci, region) == want


def test_difference_of_differences_across_experiments_by_hand():
    # (gspo - grpo) under stress minus (gspo - grpo) in the default, per seed
    runs = {"stress": [_run("gspo", 0, [(0, .4), (40, .60)]), _run("grpo", 0, [(0, .4), (40, .50)]),
                       _run("gspo", 1, [(0, .4), (40, .70)]), _run("grpo", 1, [(0, .4), (40, .55)]),
                       _run("gspo", 2, [(0, .4), (40, .70)]),  # seed 2 lacks grpo: not paired
                       _run("grpo", 3, [(0, .4), (40, .1)], status="FAILED")],
            "base": [_run("gspo", s, [(0, .4), (40, .60)]) for s in (0, 1, 2)]
            + [_run("grpo", s, [(0, .4), (40, .58)]) for s in (0, 1, 2)]}
    terms = (Term("stress", (("algo", "gspo"),)), Term("stress", (("algo", "grpo"),), sign=-1),
             Term("base", (("algo", "gspo"),), sign=-1), Term("base", (("algo", "grpo"),)))
    res = cl.evaluate_part(Part("did", terms, (0.0, math.inf)), runs)
    # seed 0: (60 - 50) - (60 - 58) = 8; seed 1: (70 - 55) - 2 = 13
    assert res.seeds == ["0", "1"]
    assert res.stat.mean == pytest.approx(10.5)
    half = student_t.ppf(0.975, 1) * math.sqrt(((8 - 10.5) ** 2 + (13 - 10.5) ** 2) / 1) / math.sqrt(2)
    assert res.stat.ci == pytest.approx((10.5 - half, 10.5 + half))
    assert res.verdict == cl.UNDECIDED  # 2 seeds: t_0.975,1 = 12.7 makes the interval straddle 0


def test_missing_runs_and_duplicates():
    runs = {"e": [_run("gspo", 0, [(0, .4), (40, .6)])]}
    got = cl.evaluate_part(Part("p", (Term("e", (("algo", "gspo"),)), Term("e", (("algo", "grpo"),), sign=-1)),
                                (0.0, math.inf)), runs)
    assert got.verdict == cl.NOT_RUN and "algo=grpo" in got.missing
    got = cl.evaluate_part(Part("p", (Term("other", (("algo", "gspo"),)),), (0.0, math.inf)), runs)
    assert got.verdict == cl.NOT_RUN and "no runs of experiment other" in got.missing
    runs["e"].append(_run("gspo", 0, [(0, .4), (40, .5)]))
    with pytest.raises(ValueError, match="two FINISHED runs"):
        cl.evaluate_part(Part("p", (Term("e", (("algo", "gspo"),)),), (0.0, math.inf)), runs)


def test_a_pair_across_two_warm_starts_is_refused_in_one_line():
    # grpo and gspo at seed 5 began from other weights (runs of two machines): no paired difference
    ws = {"a": {"resolved.warmstart.pass1": "0.48", "resolved.warmstart.dev_pass1": "0.42",
                "resolved.warmstart.steps": "499"},
          "b": {"resolved.warmstart.pass1": "0.46", "resolved.warmstart.dev_pass1": "0.43",
                "resolved.warmstart.steps": "309"}}
    part = Part("p", (Term("e", (("algo", "gspo"),)), Term("e", (("algo", "grpo"),), sign=-1)), (0.0, math.inf))
    gspo, grpo = _run("gspo", 5, [(0, .4), (40, .6)]), _run("grpo", 5, [(0, .4), (40, .5)])
    gspo.params, grpo.params = ws["a"], ws["b"]
    with pytest.raises(ConfigError, match="at seed 5 began from 2 warm starts .*0.46/0.43/309.*0.48/0.42/499"):
        cl.evaluate_part(part, {"e": [gspo, grpo]})
    grpo.params = ws["a"]  # one warm start: paired
    assert cl.evaluate_part(part, {"e": [gspo, grpo]}).stat.mean == pytest.approx(10.0)


def _res(verdict: str, decisive: bool = True) -> cl.PartResult:
    from gspo_bench.reporting.paired import paired_summary

    return cl.PartResult(Part("p", (), (0.0, 1.0), decisive=decisive), paired_summary([1.0, 2.0]), ["0", "1"],
                         verdict)


def test_combine():
    R, F, U, N = cl.REPRODUCED, cl.REFUTED, cl.UNDECIDED, cl.NOT_RUN
    assert cl.combine([_res(R), _res(R), _res(F, decisive=False)]) == R
    assert cl.combine([_res(R), _res(F)]) == F
    assert cl.combine([_res(R), _res(U)]) == U
    assert cl.combine([_res(R), _res(N)]) == U  # half the claim unmeasured is not a reproduction
    assert cl.combine([_res(N), _res(R, decisive=False)]) == N


# -- by hand: the region test of a one-edge region is the two-sided one-sample t test against that edge --------------
def _p_by_hand(ds: list[float], region: tuple[float, float]) -> tuple[float, bool]:
    """(p, inside) of the claimed ``region``'s test, by hand: for a region with one finite edge e, the two-sided
    one-sample t test of the differences against e, inside when their mean is on the region's side of e; for
    (lo, hi), the two one-sided tests of equivalence (the larger one-sided p, doubled) against the smaller
    one-sided p of lying beyond an edge, doubled."""
    mean = sum(ds) / len(ds)
    lo, hi = region
    if math.isfinite(lo) != math.isfinite(hi):
        edge = lo if math.isfinite(lo) else hi
        return float(ttest_1samp(ds, edge).pvalue), (mean > edge) == math.isfinite(lo)
    above_lo = ttest_1samp(ds, lo, alternative="greater").pvalue
    below_hi = ttest_1samp(ds, hi, alternative="less").pvalue
    p_in = min(1.0, 2 * max(above_lo, below_hi))
    p_out = min(1.0, 2 * min(1 - above_lo, 1 - below_hi))
    return (p_in, True) if p_in <= p_out else (p_out, False)


def _holm_by_hand(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment: sorted ascending, the j-th (from 0) times k - j, a running maximum, capped at 1."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for j, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - j) * ps[i]))
        out[i] = running
    return out


def test_the_hand_helpers_agree_with_the_textbook():
    # against an edge at 0 the region test is the ordinary paired t test; Holm over (0.01, 0.04, 0.03)
    ds = [1.0, 2.0, 0.5, 1.5]
    assert _p_by_hand(ds, (0.0, math.inf))[0] == pytest.approx(ttest_1samp(ds, 0.0).pvalue)
    assert _holm_by_hand([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_every_claim_names_known_experiments_and_terms():
    specs = claims(2.0)
    assert len(specs) == 22 and len({c.key for c in specs}) == 22
    # the multi-turn claims: gspo ahead of grpo on calc; sequence-level TIS behind token-level, by the margin
    [mt] = next(c for c in specs if c.key == "gspo-multiturn").parts
    assert mt.region == (2.0, math.inf) and [(t.experiment, t.sign) for t in mt.terms] == [
        ("multiturn-tools", 1), ("multiturn-tools", -1)]
    [tis] = next(c for c in specs if c.key == "vcpo-seq-tis").parts
    assert tis.region == (-math.inf, -2.0) and [dict(t.where)["tuning"] for t in tis.terms] == [
        "sequence-tis", "token-tis"]
    for c in specs:
        used = {t.experiment for p in c.parts for t in p.terms} | {cv.experiment for cv in c.curves}
        assert used <= set(c.experiments) <= set(EXPERIMENTS), c.key
    eq = next(c for c in specs if c.key == "gspo-token").parts[0]
    assert eq.region == (-2.0, 2.0)
    # DAPO's ablations: full DAPO (claims-default) minus DAPO with one part off (claims-dapo-ablation), per seed,
    # claimed ahead by more than the margin
    parts = next(c for c in specs if c.key == "dapo-parts").parts
    for part, off in zip(parts, ("no-dynamic-sampling", "no-clip-higher")):
        full, ablated = part.terms
        assert (full.experiment, full.sign, dict(full.where)) == ("claims-default", 1, {
            "algo": "dapo", "preset": "default", "tuning": "default"})
        assert (ablated.experiment, ablated.sign, dict(ablated.where)) == ("claims-dapo-ablation", -1, {
            "algo": "dapo", "tuning": off})
        assert part.region == (2.0, math.inf) and part.decisive
    # every history a measure or a figure reads is loaded (the entropy reading of clip-higher included)
    assert set(cl.needed_metrics(specs)) == {"eval/pass1", "clip/frac", "mismatch/kl", "policy/entropy",
                                             "response/length_wrong_mean", "response/length_mean",
                                             "response/truncated_frac"}
    # a part with no region (a reading) is never decisive: it has nothing to test
    assert all(not p.decisive for c in specs for p in c.parts if p.region == (-math.inf, math.inf))
    # no decisive region of a live claim has an edge at 0: a null effect can refute any of them
    for c in specs:
        for p in c.parts:
            if p.decisive and not c.retired:
                assert 0.0 not in p.region, (c.key, p.label)
    # the retired claims say why
    assert {c.key for c in specs if c.retired} == {"dr-grpo-length", "top-entropy"}


def test_regions_sit_at_the_smallest_effect_of_interest():
    specs = {c.key: c for c in claims(3.0)}
    by_label = {(k, p.label): p.region for k, c in specs.items() for p in c.parts}
    # better: ahead by more than the margin; at least as well: no worse than minus it; equal: within it
    assert by_label[("sapo", "default: final pass@1, sapo - grpo")] == (3.0, math.inf)
    assert by_label[("sapo", "hot: final pass@1, sapo - gspo")] == (-3.0, math.inf)
    assert by_label[("gspo-token", "final pass@1, gspo_token - gspo")] == (-3.0, 3.0)
    assert by_label[("moe-replay", "grpo without replay: final - warm start")] == (-math.inf, 3.0)
    # a ratio above or below: beyond 10^LOG_SESOI; the entropy lift beyond ENTROPY_SESOI nats
    assert LOG_SESOI == 0.05
    assert by_label[("cov", "entropy: log10 mean-entropy ratio clip_cov / grpo")] == (0.05, math.inf)
    assert by_label[("r3", "grpo: log10 mismatch/kl r3 / r2")] == (-math.inf, -0.05)
    assert by_label[("entropy-target", "entropy: lowest token entropy, grpo + target - grpo")] == (0.02, math.inf)
    # the cov claim reads its three algorithms at the covariance ratio the experiment ran them at
    assert {dict(t.where).get("tuning") for p in specs["cov"].parts for t in p.terms} == {"cov-ratio-2pct"}


def test_claims_command_writes_the_page(tmp_path_factory, tmp_path, capsys):
    uri, client, ids = new_store(tmp_path_factory, "claims", "claims-default", "claims-dapo-ablation")
    tags = {"tuning": "default"}
    # gspo_token tracks gspo within 0.4 points on every seed; cispo at step 20 is far below dapo at step 40
    for s, base in enumerate((0.40, 0.42, 0.41, 0.43)):
        for algo, fin in (("gspo", .60), ("gspo_token", .604), ("grpo", .58), ("dapo", .65), ("cispo", .62)):
            evals = [(0, base), (20, base + (0.05 if algo == "cispo" else 0.1)), (40, fin + s / 100)]
            log_run(client, ids["claims-default"], algo=algo, seed=s, evals=evals, tags=tags)
        # dapo without dynamic sampling (the part that decides claim 7) ends where full dapo does
        log_run(client, ids["claims-dapo-ablation"], algo="dapo", seed=s, evals=[(0, base), (40, .65 + s / 100)],
                tags={"tuning": "no-dynamic-sampling"})
    out = tmp_path / "page" / "claims.md"
    assert main(["claims", "--tracking-uri", uri, "--out", str(out)]) == 0
    page = out.read_text()
    printed = capsys.readouterr().out
    assert "GSPO-token equals GSPO" in printed and "-> reproduced" in printed
    row = next(line for line in page.splitlines() if line.startswith("| final pass@1, gspo_token - gspo"))
    # the store's runs log no dev-split pass@1: the page marks them as warm-started before the dev split
    assert "| +0.4 | [+0.4, +0.4] |" in row and row.endswith("| reproduced; runs from before the dev split |")
    # cispo at 20 minus dapo (no dynamic sampling) at 40: 45 - 65, 47 - 66, 46 - 67, 48 - 68 = -20, -19, -21, -20
    # points, far outside "no worse than -3": refuted, in the claim's own family (terms of two experiments)
    section = page.split("CISPO reaches")[2]
    assert "**Verdict: refuted" in section
    cispo = next(line for line in section.splitlines() if line.startswith("| cispo at step 20 - dapo (no dynamic"))
    p, _ = _p_by_hand([-20.0, -19.0, -21.0, -20.0], (-3.0, math.inf))
    assert f"| {cl._p(p)} | {cl._p(p)} | this claim's region tests (1) | refuted; runs from before the dev split |" in cispo
    assert "not run" in page and "experiment 'suite-long' not found" in page
    assert (out.parent / "claims" / "claim-gspo-token.png").stat().st_size > 1000
    assert not (out.parent / "claims" / "claim-stability.png").exists()  # nothing measured, no figure


def test_claims_command_bad_input(tmp_path_factory, capsys):
    uri, _, _ = new_store(tmp_path_factory, "claims-bad", "claims-default")
    assert main(["claims", "--tracking-uri", uri, "--source", "nope=sqlite:///x.db"]) == 2
    assert "EXPERIMENT one of" in one_line(capsys)
    assert main(["claims", "--tracking-uri", uri, "--margin", "-1"]) == 2
    assert "--margin must be > 0" in one_line(capsys)
    assert main(["claims", "--tracking-uri", "sqlite:////nonexistent/dir/m.db"]) == 2
    assert "no database file" in one_line(capsys)


# -- the newer losses' claims (sapo, vespo-stale, dppo-stale, dr-grpo-length) ------------------------------------
DFLT = {"preset": "default", "tuning": "default"}
COV = {"tuning": "cov-ratio-2pct"}


def _rd(algo: str, seed: int, final: float, hist: dict | None = None, **tags) -> RunData:
    """A FINISHED run: eval/pass1 0.40 at step 0 and ``final`` at step 40, plus the histories ``hist``."""
    # warm-started on the dev split, as the claims' own runs are (a run without dev_pass1 predates it)
    return RunData(f"{algo}{seed}{tags}", "FINISHED", {"algo": algo, "seed": str(seed), **tags},
                   {"resolved.warmstart.dev_pass1": "0.42"}, {},
                   {"eval/pass1": [(0, 0.40), (40, final)], **(hist or {})})


def _claim(key: str, delta: float = 3.0):
    return next(c for c in claims(delta) if c.key == key)


def _t_ci(ds: list[float]) -> tuple[float, float]:
    """The 95 % t interval of the paired differences ``ds``, by hand."""
    n, mean = len(ds), sum(ds) / len(ds)
    sd = math.sqrt(sum((d - mean) ** 2 for d in ds) / (n - 1))
    half = student_t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def test_new_claims_are_built_as_specified():
    sapo, vespo, dppo, dr = (_claim(k, 2.0) for k in ("sapo", "vespo-stale", "dppo-stale", "dr-grpo-length"))
    assert [(p.region, p.unit, p.decisive) for p in sapo.parts] == [
        ((2.0, math.inf), "points", True), ((-2.0, math.inf), "points", True),
        ((-math.inf, -LOG_SESOI), "log10", False)]
    assert [(t.experiment, dict(t.where), t.measure, t.sign) for t in sapo.parts[0].terms] == [
        ("claims-default", {"algo": "sapo", **DFLT}, "final", 1),
        ("claims-default", {"algo": "grpo", **DFLT}, "final", -1)]
    assert [(t.experiment, t.where, t.sign) for t in sapo.parts[1].terms] == [
        ("claims-hot", (("algo", "sapo"),), 1), ("claims-hot", (("algo", "gspo"),), -1)]
    assert {t.measure for t in sapo.parts[2].terms} == {"log10:clip/frac"}
    assert [c.label for c in sapo.curves] == ["default grpo", "default sapo", "hot gspo", "hot sapo"]
    # VESPO: a difference of differences (stale minus default) and a plain offpolicy difference, both decisive
    did, off = vespo.parts
    assert [(t.experiment, dict(t.where)["algo"], t.sign) for t in did.terms] == [
        ("claims-stale", "vespo", 1), ("claims-stale", "grpo", -1), ("claims-default", "vespo", -1),
        ("claims-default", "grpo", 1)]
    assert [(t.experiment, dict(t.where)["algo"], t.sign) for t in off.terms] == [
        ("claims-offpolicy", "vespo", 1), ("claims-offpolicy", "grpo", -1)]
    assert did.region == off.region == (2.0, math.inf) and did.decisive and off.decisive
    # DPPO: the same design for each divergence, four decisive parts
    assert len(dppo.parts) == 4 and all(p.decisive and p.region == (2.0, math.inf) for p in dppo.parts)
    assert [dict(p.terms[0].where)["algo"] for p in dppo.parts] == ["dppo_tv", "dppo_tv", "dppo_kl", "dppo_kl"]
    assert [c.label for c in dppo.curves] == ["stale grpo", "stale dppo_tv", "stale dppo_kl"]
    # Dr. GRPO: retired (no task lets the length vary), its parts kept as they were registered
    assert dr.retired and "length" in dr.retired
    assert dr.experiments == ("suite-long",) and dr.curve_metric == "response/length_wrong_mean"
    assert [(p.terms[0].measure, p.region, p.unit, p.decisive) for p in dr.parts] == [
        ("log10:response/length_wrong_mean", (-math.inf, -LOG_SESOI), "log10", True),
        ("final", (-2.0, math.inf), "points", True),
        ("log10:response/length_mean", (-math.inf, -LOG_SESOI), "log10", False)]
    assert [dict(t.where)["algo"] for p in dr.parts for t in p.terms] == ["dr_grpo", "grpo"] * 3


def test_every_experiment_names_the_commands_that_made_its_runs():
    import re

    for name, (what, cmds) in EXPERIMENTS.items():
        assert isinstance(cmds, tuple) and cmds and all(isinstance(c, str) and c.startswith("python -m gspo_bench ")
                                                        for c in cmds), name
    # per experiment, the algorithms and tuning tags the claims read there
    algos: dict[str, set] = {}
    tunings: dict[str, set] = {}
    for c in claims():
        for w in [(t.experiment, t.where) for p in c.parts for t in p.terms] + [(cv.experiment, cv.where)
                                                                               for cv in c.curves]:
            algos.setdefault(w[0], set()).add(dict(w[1])["algo"])
            tunings.setdefault(w[0], set()).add(dict(w[1]).get("tuning", "default"))
    for name in [n for n in EXPERIMENTS if n.startswith("claims-")]:
        cmds = EXPERIMENTS[name][1]
        named: set = set()
        for cmd in cmds:
            # each run command writes to its experiment, over the claims' seeds
            assert re.search(r"--experiment (\S+)", cmd).group(1) == name, cmd
            assert re.search(r"--seed (\S+)", cmd).group(1) in ROUNDS, cmd
            named |= set(re.search(r"--algos (\S+)", cmd).group(1).split(","))
        assert algos[name] == named, (name, algos[name] ^ named)  # every cell run is read, every cell read is run
        # a tuning tag the claims select by is set by one of the commands
        for tag in tunings[name] - {"default"}:
            assert any(f"--set tuning={tag}" in cmd for cmd in cmds), (name, tag)
    assert {"sapo"} <= algos["claims-hot"] and {"vespo", "dppo_tv", "dppo_kl"} <= algos["claims-stale"]
    # one tuning tag per part switched off, each set by the commands of its rounds
    assert {re.search(r"--set tuning=(\S+)", c).group(1) for c in EXPERIMENTS["claims-dapo-ablation"][1]} == {
        "no-dynamic-sampling", "no-clip-higher"}
    assert all(f"--set tuning={t}" in " ".join(EXPERIMENTS["claims-entropy"][1]) for t in ("cov-ratio-2pct",))


def _long_runs(wrong_dr: dict, wrong_grpo: dict) -> dict[str, list[RunData]]:
    """suite-long: grpo and dr_grpo on seeds 0-2 with the given wrong-answer length histories per seed."""
    runs = []
    for s, (g, d) in enumerate(((0.50, 0.51), (0.52, 0.53), (0.48, 0.50))):
        runs.append(_rd("grpo", s, g, {"response/length_mean": [(1, 40.0)], **(
            {"response/length_wrong_mean": wrong_grpo[s]} if s in wrong_grpo else {})}))
        runs.append(_rd("dr_grpo", s, d, {"response/length_mean": [(1, 50.0)],
                                          "response/length_wrong_mean": wrong_dr[s]}))
    return {"suite-long": runs}


GRPO_WRONG = {0: [(1, 40.0), (2, 50.0)], 1: [(1, 44.0), (2, 56.0)], 2: [(1, 38.0), (2, 42.0)]}  # means 45, 50, 40


def test_a_retired_claim_shows_its_parts_and_decides_nothing():
    # dr_grpo's wrong answers shorter on every seed (means 30, 25, 20; seed 1 has no wrong answer at step 2,
    # seed 2 none after step 1: a step without the key is no value, not a zero)
    short = {0: [(1, 30.0), (2, 30.0)], 1: [(1, 25.0), (3, 25.0)], 2: [(1, 20.0)]}
    res = cl.evaluate((_claim("dr-grpo-length"),), _long_runs(short, GRPO_WRONG))[0]
    assert res.verdict == cl.RETIRED
    wrong, final, length = res.parts
    ds = [math.log10(30 / 45), math.log10(25 / 50), math.log10(20 / 40)]
    assert wrong.seeds == ["0", "1", "2"]
    assert wrong.stat.mean == pytest.approx(sum(ds) / 3)
    assert wrong.stat.ci == pytest.approx(_t_ci(ds))
    # every part is shown as its interval's reading, none decisive, none tested: no p, no family, no MDE
    assert all(not r.part.decisive and r.p is None and r.p_family is None and r.family == "" and r.mde is None
               for r in res.parts)
    assert wrong.stat.ci[1] < -LOG_SESOI and wrong.verdict == cl.REPRODUCED  # about [-0.44, -0.08]
    # final pass@1 in points: 1, 1, 2 -> interval about [-0.1, +2.8], inside "at least as well" (> -3)
    assert final.stat.mean == pytest.approx(4 / 3) and final.stat.ci == pytest.approx(_t_ci([1.0, 1.0, 2.0]))
    assert final.verdict == cl.REPRODUCED
    assert cl.part_row(final)[-1] == "reproduced (shown, not in the verdict)"
    # all responses: dr_grpo 50 vs 40 tokens on every seed, log10 1.25 > 0: outside its region, shown
    assert length.stat.mean == pytest.approx(math.log10(1.25)) and length.verdict == cl.REFUTED
    # however the parts read, the claim stays retired, and a part not run is named as before
    longer = {0: [(1, 90.0)], 1: [(1, 100.0), (2, 120.0)], 2: [(1, 80.0)]}
    assert cl.evaluate((_claim("dr-grpo-length"),), _long_runs(longer, GRPO_WRONG))[0].verdict == cl.RETIRED
    res = cl.evaluate((_claim("dr-grpo-length"),), _long_runs(short, {}))[0]
    assert res.parts[0].verdict == cl.NOT_RUN and res.parts[0].missing == (
        "no seed has every term measured (no run has log10:response/length_wrong_mean of algo=grpo in suite-long)")
    assert res.verdict == cl.RETIRED
    assert cl.evaluate((_claim("dr-grpo-length"),), {})[0].verdict == cl.RETIRED  # no run at all: still retired
    # a retired claim registers no region with the paired tables: suite-long's dr_grpo row stays the t test
    assert region_lookup("suite-long")({"algo": "dr_grpo", "preset": "long"}, {"algo": "grpo", "preset": "long"}) \
        is None


def test_a_retired_claim_on_the_page_gives_its_reason_in_the_summary_and_its_section():
    results = cl.evaluate(claims(), _long_runs({0: [(1, 30.0)], 1: [(1, 25.0)], 2: [(1, 20.0)]}, GRPO_WRONG))
    meta = {"command": "python -m gspo_bench claims", "commit": "abc", "machine": "m", "margin": 3.0,
            "missing": {}}
    page = cl.markdown(results, meta, {})
    retired = [r for r in results if r.verdict == cl.RETIRED]
    assert [r.claim.key for r in retired] == ["dr-grpo-length", "top-entropy"]
    for r in retired:
        i = results.index(r) + 1
        assert f"| {i} | {r.claim.text} | **retired**: {r.claim.retired} |" in page
        section = page.split(f"\n## {i}. ")[1].split("\n## ")[0]
        assert f"**Verdict: retired: {r.claim.retired}.**" in section
    # its parts are in the section's table, each shown beside the verdict, never in it
    dr = page.split("\n## 12. ")[1].split("\n## ")[0]
    rows = [line for line in dr.splitlines() if line.startswith("| long: ")]
    assert len(rows) == 3 and all("(shown, not in the verdict)" in line for line in rows)
    assert all("| - | - | - |" in line for line in rows)  # p, Holm p, family: nothing tested


def test_sapo_by_hand():
    runs = {"claims-default": [], "claims-hot": []}
    for s, (g, p) in enumerate(((0.55, 0.63), (0.57, 0.66), (0.56, 0.63))):
        runs["claims-default"] += [_rd("grpo", s, g, {"clip/frac": [(1, 0.01), (2, 0.01)]}, **DFLT),
                                   _rd("sapo", s, p, {"clip/frac": [(1, 0.002), (2, 0.0)]}, **DFLT),
                                   _rd("sapo", s, 0.1, tuning="other")]  # another tuning: never picked
    for s, (g, p) in enumerate(((0.50, 0.49), (0.52, 0.50), (0.54, 0.55))):
        runs["claims-hot"] += [_rd("gspo", s, g), _rd("sapo", s, p), _rd("grpo", s, 0.02)]
    res = cl.evaluate((_claim("sapo"),), runs)[0]
    default, hot, clip = res.parts
    # default: 8, 9, 7 points -> [+5.5, +10.5], ahead by more than 3: the test against +3 decides it inside,
    # in claims-default's table, where sapo is the one algorithm compared with grpo (a family of one)
    assert default.stat.mean == pytest.approx(8.0) and default.stat.ci == pytest.approx(_t_ci([8.0, 9.0, 7.0]))
    p, inside = _p_by_hand([8.0, 9.0, 7.0], (3.0, math.inf))
    assert inside and default.p == pytest.approx(p) == pytest.approx(default.p_family) and p < 0.05
    assert default.family == "claims-default: 1 comparison against grpo, final pass@1"
    assert default.verdict == cl.REPRODUCED
    # hot: -1, -2, +1 points -> about [-4.5, +3.1], straddling -3; claims-hot's table compares grpo (-48, -50,
    # -52: the t test against 0) and sapo (the test against -3) with gspo: Holm over the two leaves sapo's p
    hot_p, hot_in = _p_by_hand([-1.0, -2.0, 1.0], (-3.0, math.inf))
    grpo_p = float(ttest_1samp([-48.0, -50.0, -52.0], 0.0).pvalue)
    assert hot.stat.ci == pytest.approx(_t_ci([-1.0, -2.0, 1.0])) and hot.stat.ci[0] < -3 < hot.stat.ci[1]
    assert hot_in and hot.p == pytest.approx(hot_p)
    assert hot.p_family == pytest.approx(_holm_by_hand([hot_p, grpo_p])[0]) and hot.p_family > 0.05
    assert hot.family == "claims-hot: 2 comparisons against gspo, final pass@1" and hot.mde_alpha == 0.025
    assert hot.verdict == cl.UNDECIDED and res.verdict == cl.UNDECIDED
    # clip/frac: sapo's mean 0.001 vs grpo's 0.01 on every seed: log10 ratio -1, below 10^-0.05, shown
    assert clip.stat.mean == pytest.approx(-1.0) and clip.verdict == cl.REPRODUCED and not clip.part.decisive
    assert clip.p is None and clip.family == ""


def test_under_another_margin_a_table_comparison_keeps_the_claims_own_region():
    # the paired tables register the default margin's regions; with --margin 5 a part claims (5, inf) and
    # (-5, inf), so the table's row (the test against +3) is not its test: its p is against its own region,
    # in its claim's own family
    runs = {"claims-default": [], "claims-hot": []}
    for s, (g, p) in enumerate(((0.55, 0.63), (0.57, 0.66), (0.56, 0.63))):
        runs["claims-default"] += [_rd("grpo", s, g, **DFLT), _rd("sapo", s, p, **DFLT)]
    for s, (g, p) in enumerate(((0.50, 0.49), (0.52, 0.50), (0.54, 0.55))):
        runs["claims-hot"] += [_rd("gspo", s, g), _rd("sapo", s, p)]
    default, hot, _ = cl.evaluate((_claim("sapo", delta=5.0),), runs)[0].parts
    assert default.part.region == (5.0, math.inf) and hot.part.region == (-5.0, math.inf)
    p_default, _ = _p_by_hand([8.0, 9.0, 7.0], (5.0, math.inf))
    p_hot, _ = _p_by_hand([-1.0, -2.0, 1.0], (-5.0, math.inf))
    assert default.p == pytest.approx(p_default) and hot.p == pytest.approx(p_hot)
    assert [default.p_family, hot.p_family] == pytest.approx(_holm_by_hand([p_default, p_hot]))
    assert default.family == hot.family == "this claim's region tests (2)"
    assert default.mde_alpha == hot.mde_alpha == 0.025
    # each p below 0.05 alone, but not after Holm over the two: neither decided
    assert max(p_default, p_hot) < 0.05 < min(default.p_family, hot.p_family)
    assert default.verdict == hot.verdict == cl.UNDECIDED


def _stale_runs(finals: dict) -> dict:
    """The three experiments' runs from ``finals[algo] = (stale, default, offpolicy)`` final pass@1 per seed."""
    runs = {"claims-stale": [], "claims-default": [], "claims-offpolicy": []}
    for algo, (stale, dflt, off) in finals.items():
        for s in range(len(stale)):
            runs["claims-stale"].append(_rd(algo, s, stale[s]))
            runs["claims-default"].append(_rd(algo, s, dflt[s], **DFLT))
            runs["claims-offpolicy"].append(_rd(algo, s, off[s]))
    return runs


def test_vespo_and_dppo_under_staleness_by_hand():
    finals = {  # algo: (stale, default, offpolicy) final pass@1 per seed 0, 1, 2
        "grpo": ((0.40, 0.42, 0.44), (0.55, 0.56, 0.57), (0.50, 0.50, 0.50)),
        "vespo": ((0.50, 0.50, 0.53), (0.56, 0.57, 0.57), (0.58, 0.59, 0.57)),
        "dppo_tv": ((0.45, 0.48, 0.49), (0.55, 0.56, 0.57), (0.52, 0.53, 0.52)),
        "dppo_kl": ((0.30, 0.31, 0.33), (0.56, 0.56, 0.58), (0.51, 0.50, 0.52)),
    }
    runs = _stale_runs(finals)
    vespo, dppo = cl.evaluate((_claim("vespo-stale"), _claim("dppo-stale")), runs)
    # offpolicy, claims-offpolicy's table against grpo (three comparisons, each registered as "> +3"):
    # vespo 8, 9, 7; dppo_tv 2, 3, 2; dppo_kl 1, 0, 2
    off = {a: _p_by_hand(ds, (3.0, math.inf)) for a, ds in
           (("vespo", [8.0, 9.0, 7.0]), ("dppo_tv", [2.0, 3.0, 2.0]), ("dppo_kl", [1.0, 0.0, 2.0]))}
    holm_off = dict(zip(off, _holm_by_hand([p for p, _ in off.values()])))
    # vespo: (50 - 40) - (56 - 55) = 9, (50 - 42) - (57 - 56) = 7, (53 - 44) - (57 - 57) = 9: its claim's own
    # family, of one
    did, voff = vespo.parts
    assert did.stat.mean == pytest.approx(25 / 3) and did.stat.ci == pytest.approx(_t_ci([9.0, 7.0, 9.0]))
    p, inside = _p_by_hand([9.0, 7.0, 9.0], (3.0, math.inf))
    assert inside and did.p == pytest.approx(p) == pytest.approx(did.p_family) and p < 0.05
    assert did.family == "this claim's region tests (1)" and did.verdict == cl.REPRODUCED
    assert voff.stat.ci == pytest.approx(_t_ci([8.0, 9.0, 7.0])) and voff.p == pytest.approx(off["vespo"][0])
    assert voff.p_family == pytest.approx(holm_off["vespo"]) and holm_off["vespo"] < 0.05
    assert voff.verdict == cl.REPRODUCED
    assert voff.family == "claims-offpolicy: 3 comparisons against grpo, final pass@1"
    assert vespo.verdict == cl.REPRODUCED
    # dppo_tv: (45 - 40) - 0, (48 - 42) - 0, (49 - 44) - 0 = 5, 6, 5; dppo_kl: (30 - 40) - 1, (31 - 42) - 0,
    # (33 - 44) - 1 = -11, -11, -12: the claim's own family of two
    tv_did, tv_off, kl_did, kl_off = dppo.parts
    p_tv, in_tv = _p_by_hand([5.0, 6.0, 5.0], (3.0, math.inf))
    p_kl, in_kl = _p_by_hand([-11.0, -11.0, -12.0], (3.0, math.inf))
    assert in_tv and not in_kl
    assert [tv_did.p, kl_did.p] == pytest.approx([p_tv, p_kl])
    assert [tv_did.p_family, kl_did.p_family] == pytest.approx(_holm_by_hand([p_tv, p_kl]))
    assert tv_did.family == kl_did.family == "this claim's region tests (2)"
    assert tv_did.verdict == cl.REPRODUCED and kl_did.verdict == cl.REFUTED
    # the offpolicy parts: 2, 3, 2 and 1, 0, 2 lie under +3 but not decidedly after Holm over the table's three
    assert [tv_off.p, kl_off.p] == pytest.approx([off["dppo_tv"][0], off["dppo_kl"][0]])
    assert [tv_off.p_family, kl_off.p_family] == pytest.approx([holm_off["dppo_tv"], holm_off["dppo_kl"]])
    assert min(tv_off.p_family, kl_off.p_family) > 0.05 and tv_off.verdict == kl_off.verdict == cl.UNDECIDED
    assert dppo.verdict == cl.REFUTED  # one decisive part refuted refutes the claim
    # without the default's dppo runs the differences of differences are not run; offpolicy alone decides nothing
    runs["claims-default"] = [r for r in runs["claims-default"] if not r.tags["algo"].startswith("dppo")]
    dppo = cl.evaluate((_claim("dppo-stale"),), runs)[0]
    assert [p.verdict for p in dppo.parts] == [cl.NOT_RUN, cl.UNDECIDED, cl.NOT_RUN, cl.UNDECIDED]
    assert "no FINISHED run of claims-default with algo=dppo_tv" in dppo.parts[0].missing
    assert dppo.verdict == cl.UNDECIDED


def test_a_null_effect_refutes_a_directional_claim_and_a_real_one_reproduces_it():
    # vespo's lead over grpo under staleness minus its lead in the default, 8 seeds, claimed "> +3": differences
    # around 0 with a small spread put the interval wholly under +3 (refuted); the same shifted by +8 put it
    # wholly above (reproduced). No offpolicy run: that part is not run, the difference of differences alone is
    # its claim's own family
    null = [0.5, -0.5, 1.0, -1.0, 0.0, 0.5, -0.5, 0.0]

    def runs_for(ds):
        runs = {"claims-stale": [], "claims-default": []}
        for s, d in enumerate(ds):
            runs["claims-stale"] += [_rd("grpo", s, 0.50), _rd("vespo", s, 0.50 + d / 100)]
            runs["claims-default"] += [_rd("grpo", s, 0.55, **DFLT), _rd("vespo", s, 0.55, **DFLT)]
        return runs

    for ds, inside, want in ((null, False, cl.REFUTED), ([d + 8 for d in null], True, cl.REPRODUCED)):
        res = cl.evaluate((_claim("vespo-stale"),), runs_for(ds))[0]
        did, off = res.parts
        assert off.verdict == cl.NOT_RUN
        assert did.stat.n == 8 and did.stat.mean == pytest.approx(sum(ds) / 8)
        assert did.stat.ci == pytest.approx(_t_ci(ds))
        p, side = _p_by_hand(ds, (3.0, math.inf))
        assert side == inside and did.p == pytest.approx(p) and did.p_family == pytest.approx(p) and p < 0.05
        assert did.family == "this claim's region tests (1)" and did.mde_alpha == 0.05
        assert did.verdict == want
        # half the claim not run: a refutation refutes it, a reproduction leaves it undecided
        assert res.verdict == (cl.REFUTED if want == cl.REFUTED else cl.UNDECIDED)
    # the null effect's interval holds 0 (the paired t test against 0 does not reject) yet lies under +3
    lo, hi = _t_ci(null)
    assert lo < 0 < hi < 3 and ttest_1samp(null, 0.0).pvalue > 0.05


def test_page_names_every_command_and_claims_not_run_or_retired():
    results = cl.evaluate(claims(), {})
    meta = {"command": "python -m gspo_bench claims", "commit": "abc", "machine": "m", "margin": 3.0,
            "missing": {e: f"experiment {e!r} not found" for e in EXPERIMENTS}}
    page = cl.markdown(results, meta, {})
    assert all(r.verdict == (cl.RETIRED if r.claim.retired else cl.NOT_RUN) for r in results)
    sections = page.split("\n## ")[1:]
    assert len(sections) == 22
    sapo = next(s for s in sections if s.startswith("9. SAPO's soft gate"))
    assert "**Verdict: not run.**" in sapo and "arXiv 2511.20347" in sapo
    # each command of an experiment is its own item under it
    assert ("  - `python -m gspo_bench run --preset hot --algos grpo,gspo,sapo --experiment claims-hot "
            "--seed 0,1,2,3,4,5`") in sapo
    assert ("  - `python -m gspo_bench run --algos grpo,gspo,gspo_token,cispo,dapo,sapo --experiment claims-default "
            "--set train.lr=2e-4 --set train.lr_schedule=constant --seed 0,1,2,3,4,5,6,7`") in sapo
    assert ("  - `python -m gspo_bench run --algos vespo,dppo_tv,dppo_kl --experiment claims-default "
            "--set train.lr=2e-4 --set train.lr_schedule=constant --seed 0,1,2,3,4,5`") in sapo
    dr = next(s for s in sections if s.startswith("12. Dropping GRPO's std"))
    assert "arXiv 2503.20783" in dr and "**Verdict: retired: no built-in task" in dr
    assert "  - `python -m gspo_bench suite --scenarios long --algos grpo,gspo,dr_grpo --seeds 3`" in dr
    for key in ("vespo-stale", "dppo-stale"):
        text = next(s for s in sections if _claim(key).text in s.split("\n")[0])
        for scenario in ("stale", "offpolicy"):
            assert (f"  - `python -m gspo_bench run --preset {scenario} --algos grpo,gspo,vespo,dppo_tv,dppo_kl "
                    f"--experiment claims-{scenario} --seed 0,1,2,3,4,5`") in text and "not run" in text


def test_claims_command_with_only_some_experiments(tmp_path_factory, tmp_path, capsys):
    uri, client, ids = new_store(tmp_path_factory, "claims-new", "claims-default", "suite-long")
    # suite-long: dr_grpo's wrong answers 20 tokens vs grpo's 40, pass@1 +1 point; no sapo run anywhere
    for s in range(3):
        for algo, wrong, fin in (("grpo", 40.0, 0.50), ("dr_grpo", 20.0 + s, 0.51)):
            metrics = [("response/length_wrong_mean", st, wrong) for st in (1, 2, 3)]
            metrics += [("response/length_mean", st, wrong - 5) for st in (1, 2, 3)]
            log_run(client, ids["suite-long"], algo=algo, seed=s, evals=[(0, 0.40), (40, fin + s / 100)],
                    tags={"preset": "long"}, metrics=metrics)
        log_run(client, ids["claims-default"], algo="grpo", seed=s, evals=[(0, 0.40), (40, 0.55)],
                tags={"tuning": "default"})
    out = tmp_path / "claims.md"
    assert main(["claims", "--tracking-uri", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wrong answers stop growing longer. -> retired" in printed
    assert "SAPO's soft gate keeps more learning signal than hard clipping, and is at least as stable as GSPO. " \
           "-> not run" in printed
    page = out.read_text()
    row = next(line for line in page.splitlines() if line.startswith("| long: log10 wrong-answer length ratio"))
    ds = [math.log10((20 + s) / 40) for s in range(3)]
    lo, hi = _t_ci(ds)
    assert f"[{lo:+.2f}, {hi:+.2f}]" in row and row.endswith("| reproduced (shown, not in the verdict); runs from before the dev split |")
    assert "no FINISHED run of claims-default with algo=sapo" in page
    figs = out.parent / "claims"
    assert (figs / "claim-dr-grpo-length.png").stat().st_size > 1000
    assert not (figs / "claim-sapo.png").exists() and not (figs / "claim-vespo-stale.png").exists()


def test_claims_runs_table_without_any_claim_experiment_is_one_line_exit_2(tmp_path, capsys):
    import gzip

    table = tmp_path / "runs.csv.gz"
    table.write_bytes(gzip.compress(b"run_id,status,experiment,artifact_uri,tags.algo,tags.seed,metric,step,value\n"
                                    b"r1,FINISHED,my-exp,,grpo,0,eval/pass1,-1,0.5\n"
                                    b"r2,FINISHED,other-exp,,gspo,0,eval/pass1,-1,0.6\n"))
    out = tmp_path / "page" / "claims.md"
    assert main(["claims", "--runs", str(table), "--out", str(out)]) == 2
    text = one_line(capsys)
    assert "holds none of the experiments the claims read" in text and "it holds my-exp, other-exp" in text, text
    assert all(name in text for name in EXPERIMENTS)
    assert not out.parent.exists()  # refused before the page's folder is made


# -- one comparison, one region, one set of numbers --------------------------------------------------------------
def _final_part(label: str, exp: str, a: dict, b: dict, region: tuple[float, float], decisive: bool = True) -> Part:
    return Part(label, (Term(exp, tuple(a.items())), Term(exp, tuple(b.items()), sign=-1)), region,
                decisive=decisive)


def _bare_claim(key: str, *parts: Part, retired: str = "") -> Claim:
    return Claim(key, f"claim {key}", "src", "design", ("e",), parts, (), retired=retired)


def test_two_claims_registering_different_regions_for_one_comparison_is_a_value_error():
    a, b = {"algo": "sapo", "preset": "default"}, {"algo": "grpo", "preset": "default"}
    better = _bare_claim("better", _final_part("sapo - grpo", "e", a, b, (3.0, math.inf)))
    worse = _bare_claim("worse", _final_part("sapo - grpo", "e", dict(reversed(a.items())), b, (-3.0, math.inf)))
    with pytest.raises(ValueError, match="claims 'better' and 'worse' register different regions") as e:
        registered((better, worse))
    assert "(3.0, inf) and (-3.0, inf)" in str(e.value)
    # the same region twice is one registration; a part shown beside a verdict, a retired claim's part, a part
    # of two experiments or of another measure register nothing
    same = _bare_claim("same", _final_part("again", "e", a, b, (3.0, math.inf)))
    shown = _bare_claim("shown", _final_part("shown", "e", a, b, (-3.0, math.inf), decisive=False))
    gone = _bare_claim("gone", _final_part("gone", "e", a, b, (-3.0, math.inf)), retired="no miniature")
    across = _bare_claim("across", Part("x", (Term("e", tuple(a.items())), Term("f", tuple(b.items()), sign=-1)),
                                        (-3.0, math.inf)))
    at20 = _bare_claim("at20", Part("x", (Term("e", tuple(a.items()), "at:20"), Term("e", tuple(b.items()), sign=-1)),
                                    (-3.0, math.inf)))
    got = registered((better, same, shown, gone, across, at20))
    assert got == {("e", (("algo", "sapo"), ("preset", "default")), (("algo", "grpo"), ("preset", "default"))):
                   (3.0, math.inf)}
    assert table_comparison(across.parts[0]) is None and table_comparison(at20.parts[0]) is None


def test_the_real_claims_register_each_comparison_once():
    for delta in (1.0, 3.0, 5.0):
        got = registered(claims(delta))  # no ValueError: no comparison has two regions
        assert got[("claims-default", (("algo", "sapo"), ("preset", "default"), ("tuning", "default")),
                    (("algo", "grpo"), ("preset", "default"), ("tuning", "default")))] == (delta, math.inf)
        # only live claims' decisive parts: the retired claims' and the readings' comparisons are not there
        assert all(exp != "controls-default" for exp, _, _ in got)
        assert ("claims-stale", (("algo", "gspo"),), (("algo", "grpo"),)) not in got  # shown, not decisive
    lookup = region_lookup("claims-default")
    cell = {"task": "arith", "model": "tiny-dense", "preset": "default", "tuning": "default"}
    assert lookup({**cell, "algo": "sapo"}, {**cell, "algo": "grpo"}) == (3.0, math.inf)
    assert lookup({**cell, "algo": "gspo_token"}, {**cell, "algo": "gspo"}) == (-3.0, 3.0)
    # the same comparison the other way round: the mirrored region, so its verdict is the same
    assert lookup({**cell, "algo": "grpo"}, {**cell, "algo": "sapo"}) == (-math.inf, -3.0)
    assert lookup({**cell, "algo": "sapo", "tuning": "x"}, {**cell, "algo": "grpo", "tuning": "x"}) is None
    assert region_lookup("claims-hot")({**cell, "algo": "sapo"}, {**cell, "algo": "grpo"}) is None
    # a split table's cells differ in a tag both registered tag sets pin
    moe = region_lookup("claims-moe")
    grpo = {**cell, "algo": "grpo", "correction": "none"}
    assert moe({**grpo, "routing_replay": "r3"}, {**grpo, "routing_replay": "none"}) == (3.0, math.inf)
    assert moe({**grpo, "routing_replay": "r2"}, {**grpo, "routing_replay": "none"}) is None


def _default_store(tmp_path_factory):
    """claims-default: grpo, gspo, gspo_token and sapo on 4 seeds (final pass@1 in points below)."""
    uri, client, ids = new_store(tmp_path_factory, "claims-one", "claims-default")
    grpo = (0.50, 0.52, 0.51, 0.53)
    lead = {"grpo": (0, 0, 0, 0), "sapo": (8, 9, 7, 8.5), "gspo": (1, -1, 2, 0), "gspo_token": (1.4, -0.4, 2.5, 0.3)}
    for s in range(4):
        for algo, d in lead.items():
            log_run(client, ids["claims-default"], algo=algo, seed=s, evals=[(0, 0.40), (40, grpo[s] + d[s] / 100)],
                    tags={"tuning": "default"})
    return uri


def test_a_registered_comparison_has_the_same_numbers_on_the_claims_page_and_in_the_report(tmp_path_factory,
                                                                                           tmp_path, capsys):
    from gspo_bench.reporting.frame import read_frame, runs_of
    from gspo_bench.reporting.pairing import p_text
    from gspo_bench.reporting.paired_table import paired_groups

    uri = _default_store(tmp_path_factory)
    page = tmp_path / "page" / "claims.md"
    assert main(["claims", "--tracking-uri", uri, "--out", str(page)]) == 0
    table = page.parent / "claims" / "runs.csv.gz"
    runs = runs_of(read_frame(table))
    # the paired table against grpo: sapo (claimed "> +3" by the sapo claim), gspo ("> -3", the clip claim) and
    # gspo_token (no claim against grpo: the t test against 0), one Holm family of three
    (group,) = paired_groups(runs, "grpo", regions=region_lookup("claims-default"))
    rows = {r["algo"]: r for r in group.rows if r["metric"] == "final_pass1"}
    sapo_ds, gspo_ds, token_ds = [8.0, 9.0, 7.0, 8.5], [1.0, -1.0, 2.0, 0.0], [1.4, -0.4, 2.5, 0.3]
    want = {"sapo": _p_by_hand(sapo_ds, (3.0, math.inf)), "gspo": _p_by_hand(gspo_ds, (-3.0, math.inf)),
            "gspo_token": (float(ttest_1samp(token_ds, 0.0).pvalue), None)}
    holm = dict(zip(want, _holm_by_hand([p for p, _ in want.values()])))
    for algo, (p, inside) in want.items():
        row = rows[algo]
        assert row["p"] == pytest.approx(p) and row["p_holm"] == pytest.approx(holm[algo]), algo
        assert row.get("inside") == inside and row["mde_alpha"] == pytest.approx(0.05 / 3)
    assert rows["sapo"]["region"] == (3.0, math.inf) and rows["sapo"]["label"] == "final pass@1, claimed > +3"
    assert "region" not in rows["gspo_token"] and rows["gspo_token"]["label"] == "final pass@1"
    # the claims: the sapo part is that row, in points
    res = cl.evaluate(claims(), {"claims-default": runs})
    part = next(r for c in res if c.claim.key == "sapo" for r in c.parts if r.part.label.startswith("default: final"))
    row = rows["sapo"]
    assert part.p == pytest.approx(row["p"]) and part.p_family == pytest.approx(row["p_holm"])
    assert part.mde == pytest.approx(100 * row["mde"]) and part.mde_alpha == pytest.approx(row["mde_alpha"])
    assert part.stat.ci == pytest.approx((100 * row["ci_low"], 100 * row["ci_high"]))
    assert part.stat.ci == pytest.approx(_t_ci(sapo_ds)) and part.stat.mean == pytest.approx(100 * row["mean_diff"])
    assert part.family == "claims-default: 3 comparisons against grpo, final pass@1"
    assert holm["sapo"] < 0.05 and part.verdict == cl.REPRODUCED  # decided, inside
    # the gspo - grpo part of the clip claim is the gspo row, decided inside "no worse than -3"
    clip = next(r for c in res if c.claim.key == "clip" for r in c.parts if r.part.label.startswith("default: final"))
    assert clip.p == pytest.approx(rows["gspo"]["p"]) and clip.p_family == pytest.approx(holm["gspo"])
    assert clip.verdict == (cl.REPRODUCED if holm["gspo"] < 0.05 else cl.UNDECIDED)
    # the claims page prints those numbers on the part's line
    line = next(x for x in page.read_text().splitlines() if x.startswith("| default: final pass@1, sapo - grpo"))
    assert (f"| {cl._p(row['p'])} | {cl._p(row['p_holm'])} | claims-default: 3 comparisons against grpo, final "
            "pass@1 | reproduced; runs from before the dev split |") in line
    assert f"{100 * row['mde']:.1f} (α 0.017)" in line
    # the report of claims-default from the same runs table prints the row with its claimed region and that p
    capsys.readouterr()
    out = tmp_path / "report"
    assert main(["report", "--runs", str(table), "--experiment", "claims-default", "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    (sapo_line,) = [x for x in md.splitlines() if "| sapo | grpo | final pass@1, claimed > +3 (points) |" in x]
    assert f"| {p_text(row['p'])} | {p_text(row['p_holm'])} |" in sapo_line
    assert "| +8.1 |" in sapo_line  # (8 + 9 + 7 + 8.5) / 4 = 8.125 points
    (token_line,) = [x for x in md.splitlines() if "| gspo_token | grpo | final pass@1 (points) |" in x]
    assert f"| {p_text(rows['gspo_token']['p'])} |" in token_line  # no claim: the t test against 0
    # the leaderboard's paired table says the same
    assert main(["leaderboard", "--runs", str(table), "--experiment", "claims-default", "--format", "md"]) == 0
    board = capsys.readouterr().out
    (board_line,) = [x for x in board.splitlines() if "| sapo | grpo | final pass@1, claimed > +3 (points) |" in x]
    assert f"| {p_text(row['p'])} | {p_text(row['p_holm'])} |" in board_line


def test_a_suites_leaderboard_page_tests_a_registered_comparison_against_its_region():
    from gspo_bench.reporting.pairing import p_text
    from gspo_bench.reporting.suite_summary import leaderboard_md

    # suite-long: gspo - grpo is claimed "> +3" (stability); the scenario page's paired table says so, with the
    # p of that test (6, 7, 5 points: against +3), and the claims page prints the same p and Holm p
    runs = []
    for s, lead in enumerate((6, 7, 5)):
        runs += [_rd("grpo", s, 0.50 + s / 100, preset="long"), _rd("gspo", s, 0.50 + (s + lead) / 100, preset="long")]
    p, inside = _p_by_hand([6.0, 7.0, 5.0], (3.0, math.inf))
    md = leaderboard_md(runs, "long", "suite-long", "grpo")
    (line,) = [x for x in md.splitlines() if "| gspo | grpo | final pass@1, claimed > +3 (points) |" in x]
    assert f"| {p_text(p)} | {p_text(p)} |" in line  # a family of one
    part = next(r for r in cl.evaluate((_claim("stability"),), {"suite-long": runs})[0].parts
                if r.part.label.startswith("long:"))
    assert inside and part.p == pytest.approx(p) == pytest.approx(part.p_family) and part.verdict == cl.REPRODUCED
    # another experiment's page registers nothing: the same runs are the t test against 0 there
    other = leaderboard_md(runs, "long", "my-long", "grpo")
    assert "claimed >" not in other
    (line,) = [x for x in other.splitlines() if "| gspo | grpo | final pass@1 (points) |" in x]
    assert f"| {p_text(float(ttest_1samp([6.0, 7.0, 5.0], 0.0).pvalue))} |" in line


def test_a_table_comparison_whose_terms_pin_settings_is_that_splits_row_not_an_average_over_settings():
    from gspo_bench.reporting.paired_table import paired_groups

    # claims-moe holds grpo and gspo under four (routing_replay, correction) settings; the part "moe bf16, no
    # replay: gspo - grpo" names none/none, so it is the none/none split's row of `report --by
    # routing_replay,correction` (its p, Holm p over that split's 2 algorithms, MDE), whatever the other settings do
    lead = {"none": (0.010, 0.030, 0.020), "r3": (-0.05, 0.08, -0.01), "r2": (0.04, -0.06, 0.0),
            "tis": (0.09, -0.02, 0.05)}
    runs = {"claims-moe": [], "claims-stale": [], "claims-default": []}
    for setting, tags in {"none": ("none", "none"), "r3": ("r3", "none"), "r2": ("r2", "none"),
                          "tis": ("none", "tis")}.items():
        tag = {**DFLT, "routing_replay": tags[0], "correction": tags[1]}
        for s in range(3):
            runs["claims-moe"].append(_rd("grpo", s, 0.60 + s / 50, **tag))
            runs["claims-moe"].append(_rd("gspo", s, 0.60 + s / 50 + lead[setting][s], **tag))
            runs["claims-moe"].append(_rd("cispo", s, 0.61 + s / 50 + (s % 2) / 100, **tag))
    part = next(r for r in cl.evaluate((_claim("mismatch"),), runs)[0].parts if r.part.label.startswith("moe"))
    assert part.stat.ci == pytest.approx(_t_ci([1.0, 3.0, 2.0]))
    [group] = [g for g in paired_groups(runs["claims-moe"], by=("correction", "routing_replay"),
                                        regions=region_lookup("claims-moe"))
               if g.key[4:] == ("none", "none")]
    row = next(r for r in group.rows if r["algo"] == "gspo" and r["metric"] == "final_pass1")
    # 1, 3, 2 points against "> +3": the test against +3, outside side; cispo (1, 2, 1: no claim) the t test vs 0
    p, inside = _p_by_hand([1.0, 3.0, 2.0], (3.0, math.inf))
    p_cispo = float(ttest_1samp([1.0, 2.0, 1.0], 0.0).pvalue)
    assert row["p"] == pytest.approx(p) and row["inside"] is inside is False
    assert part.p == pytest.approx(row["p"]) and part.p_family == pytest.approx(row["p_holm"])
    assert part.p_family == pytest.approx(_holm_by_hand([p, p_cispo])[0]) and part.verdict == cl.UNDECIDED
    assert part.mde == pytest.approx(100 * row["mde"]) and part.mde_alpha == pytest.approx(0.05 / 2)
    assert part.family == ("claims-moe, correction=none, routing_replay=none: 2 comparisons against grpo, "
                           "final pass@1")


def test_one_algorithm_under_two_settings_is_the_split_tables_row():
    from gspo_bench.reporting.split_pairs import split_pair_groups

    # grpo, gspo and cispo under routing replay none, r3 and r2 (correction none): the moe-replay part "grpo: r3 -
    # none" is split_pair_groups' row of grpo's r3 split against routing_replay=none, in that table's family of
    # six comparisons (three algorithms x r3, r2), where only grpo r3 - none is claimed ("> +3")
    finals = {  # final pass@1 per seed 0, 1, 2 under none, r3, r2
        "grpo": ((0.40, 0.42, 0.41), (0.50, 0.53, 0.51), (0.41, 0.42, 0.43)),
        "gspo": ((0.50, 0.52, 0.51), (0.50, 0.53, 0.50), (0.49, 0.52, 0.52)),
        "cispo": ((0.45, 0.46, 0.47), (0.46, 0.46, 0.49), (0.44, 0.47, 0.47)),
    }
    runs = {"claims-moe": []}
    for algo, by_setting in finals.items():
        for replay, vals in zip(("none", "r3", "r2"), by_setting):
            for s, v in enumerate(vals):
                runs["claims-moe"].append(_rd(algo, s, v, routing_replay=replay, correction="none", **DFLT))
    res = cl.evaluate((_claim("moe-replay"),), runs)[0]
    warm, r3, gspo = res.parts
    (group,) = split_pair_groups(runs["claims-moe"], "routing_replay", "none", ("correction", "routing_replay"),
                                 regions=region_lookup("claims-moe"))
    fam = [r for r in group.rows if r["metric"] == "final_pass1"]
    row = next(r for r in fam if r["algo"] == "grpo" and r["by"]["routing_replay"] == "r3")
    # grpo r3 - none: 10, 11, 10 points (claimed "> +3"); gspo r3 - none: 0, 1, -1 (claimed "< +3"); the other
    # four rows (no claim) are t tests against 0
    ds = {(a, rr): [round(100 * (finals[a][i][s] - finals[a][0][s]), 6) for s in range(3)]
          for a in finals for i, rr in ((1, "r3"), (2, "r2"))}
    assert ds[("grpo", "r3")] == [10.0, 11.0, 10.0] and ds[("gspo", "r3")] == [0.0, 1.0, -1.0]
    p, inside = _p_by_hand(ds[("grpo", "r3")], (3.0, math.inf))
    assert row["p"] == pytest.approx(p) and row["inside"] and row["label"] == "final pass@1, claimed > +3"
    claimed = {("grpo", "r3"): (3.0, math.inf), ("gspo", "r3"): (-math.inf, 3.0)}
    ps = {k: (_p_by_hand(v, claimed[k])[0] if k in claimed else float(ttest_1samp(v, 0.0).pvalue))
          for k, v in ds.items()}
    holm = dict(zip(ps, _holm_by_hand(list(ps.values()))))
    assert row["p_holm"] == pytest.approx(holm[("grpo", "r3")])
    assert r3.p == pytest.approx(row["p"]) and r3.p_family == pytest.approx(row["p_holm"])
    assert r3.mde == pytest.approx(100 * row["mde"]) and r3.mde_alpha == pytest.approx(0.05 / 6)
    assert r3.family == "claims-moe: 6 comparisons against routing_replay=none, final pass@1"
    assert r3.verdict == (cl.REPRODUCED if holm[("grpo", "r3")] < 0.05 else cl.UNDECIDED) == cl.REPRODUCED
    # gspo r3 - none (claimed "< +3") is the same table's row
    assert gspo.family == "claims-moe: 6 comparisons against routing_replay=none, final pass@1"
    assert gspo.p == pytest.approx(ps[("gspo", "r3")]) and gspo.p_family == pytest.approx(holm[("gspo", "r3")])
    # the warm-start part (final - warm of one run) is no table comparison: its claim's own family, of one
    assert warm.family == "this claim's region tests (1)"
    assert warm.p == pytest.approx(_p_by_hand([0.0, 2.0, 1.0], (-math.inf, 3.0))[0])


def test_claims_target_mde_prints_the_seeds_each_part_needs_at_its_deciding_level(tmp_path, capsys):
    from gspo_bench.reporting.paired import sd_interval, seeds_needed

    finals = {"grpo": ((0.40, 0.42, 0.44), (0.55, 0.56, 0.57), (0.50, 0.50, 0.50)),
              "dppo_tv": ((0.35, 0.39, 0.38), (0.55, 0.56, 0.57), (0.51, 0.53, 0.52)),
              "dppo_kl": ((0.36, 0.39, 0.39), (0.56, 0.56, 0.58), (0.51, 0.52, 0.50))}
    runs = _stale_runs(finals)
    res = cl.evaluate((_claim("dppo-stale"),), runs)
    plan = cl.plan_parts(res, 3.0)
    tv = next(r for r in plan if r["part"].startswith("stale vs default: (dppo_tv"))
    sd = math.sqrt(((-5 + 14 / 3) ** 2 + (-3 + 14 / 3) ** 2 + (-6 + 14 / 3) ** 2) / 2)  # of -5, -3, -6
    assert tv["sd"] == pytest.approx(sd) and tv["level"] == pytest.approx(0.025)  # the claim's 2 region tests
    assert tv["seeds"] == seeds_needed(sd, 3.0, 0.025) and tv["sd_ci"] == pytest.approx(sd_interval(sd, 3))
    assert tv["seeds_range"] == tuple(seeds_needed(x, 3.0, 0.025) for x in sd_interval(sd, 3))
    assert 3 < tv["seeds"] < tv["seeds_range"][1]
    # an offpolicy part plans at its table's level: claims-offpolicy compares dppo_tv and dppo_kl with grpo
    off = next(r for r in plan if r["part"] == "offpolicy: final pass@1, dppo_tv - grpo")
    assert off["level"] == pytest.approx(0.025)
    text = cl.render_plan(plan, 3.0)
    assert "| dppo-stale | stale vs default: (dppo_tv - grpo) on stale - (dppo_tv - grpo) on default | points | 3 |" in text
    # the command: printed, no page written; a target of 0 is one line and exit 2
    out = tmp_path / "c.md"
    assert main(["claims", "--runs", "results/claims/runs.csv.gz", "--target-mde", "5", "--out", str(out)]) == 0
    assert "Seeds to detect 5" in capsys.readouterr().out and not out.exists()
    assert main(["claims", "--runs", "results/claims/runs.csv.gz", "--target-mde", "0"]) == 2
    assert "--target-mde 0" in one_line(capsys)


def test_claims_joins_runs_tables_each_seed_from_one(tmp_path_factory, tmp_path, capsys):
    """``--runs A --runs B``: each experiment from the tables that hold it, the joined table written beside the
    page; an experiment's later seeds may come from another table (a later round's store), but a seed of an
    experiment in two tables is one line and exit 2, before any page."""
    from gspo_bench.reporting.frame import read_frame

    uri, client, ids = new_store(tmp_path_factory, "claims-join", "claims-default", "suite-long")
    for s in range(3):
        for algo, fin in (("gspo", .60), ("gspo_token", .601 + s / 1000)):
            log_run(client, ids["claims-default"], algo=algo, seed=s, evals=[(0, 0.40), (40, fin)],
                    tags={"tuning": "default"})
        for algo, fin in (("grpo", .50), ("gspo", .52 + s / 100)):
            log_run(client, ids["suite-long"], algo=algo, seed=s, evals=[(0, 0.40), (40, fin)],
                    tags={"preset": "long"})
    empty, _, _ = new_store(tmp_path_factory, "claims-join-empty", "other")
    tables = {}
    for name in ("claims-default", "suite-long"):  # one table per experiment, as two stores would give
        page = tmp_path / name / "claims.md"
        assert main(["claims", "--source", f"{name}={uri}", "--tracking-uri", empty, "--out", str(page)]) == 0
        tables[name] = page.parent / "claims" / "runs.csv.gz"
        assert set(read_frame(tables[name])["experiment"]) == {name}
    capsys.readouterr()
    out = tmp_path / "joined" / "claims.md"
    assert main(["claims", "--runs", str(tables["claims-default"]), "--runs", str(tables["suite-long"]),
                 "--out", str(out)]) == 0
    page = out.read_text()
    gspo_token = next(line for line in page.splitlines() if line.startswith("| final pass@1, gspo_token - gspo"))
    assert "| 3 (0,1,2) | +0.2 |" in gspo_token  # (0.1 + 0.2 + 0.3) / 3 points, from the first table
    long_row = next(line for line in page.splitlines() if line.startswith("| long: final pass@1, gspo - grpo"))
    assert "| 3 (0,1,2) | +3.0 |" in long_row  # (2 + 3 + 4) / 3 points, from the second
    joined = read_frame(out.parent / "claims" / "runs.csv.gz")
    assert set(joined["experiment"]) == {"claims-default", "suite-long"}
    assert joined["run_id"].nunique() == 12
    # a later round: seeds 3 and 4 of suite-long in a store of their own, joined to the page's table
    later, client3, ids3 = new_store(tmp_path_factory, "claims-join-later", "suite-long")
    for s in (3, 4):
        for algo, fin in (("grpo", .50), ("gspo", .50 + (s + 2) / 100)):
            log_run(client3, ids3["suite-long"], algo=algo, seed=s, evals=[(0, 0.40), (40, fin)],
                    tags={"preset": "long"})
    page3 = tmp_path / "later" / "claims.md"
    assert main(["claims", "--source", f"suite-long={later}", "--tracking-uri", empty, "--out", str(page3)]) == 0
    capsys.readouterr()
    grown = tmp_path / "grown" / "claims.md"
    assert main(["claims", "--runs", str(out.parent / "claims" / "runs.csv.gz"),
                 "--runs", str(page3.parent / "claims" / "runs.csv.gz"), "--out", str(grown)]) == 0
    long_row = next(line for line in grown.read_text().splitlines()
                    if line.startswith("| long: final pass@1, gspo - grpo"))
    assert "| 5 (0,1,2,3,4) | +4.0 |" in long_row  # (2 + 3 + 4 + 5 + 6) / 5 points, from both tables
    assert read_frame(grown.parent / "claims" / "runs.csv.gz")["run_id"].nunique() == 16
    capsys.readouterr()
    assert main(["claims", "--runs", str(tables["suite-long"]), "--runs", str(out.parent / "claims" / "runs.csv.gz"),
                 "--out", str(tmp_path / "twice" / "claims.md")]) == 2
    text = one_line(capsys)
    assert "seed 0 of experiment 'suite-long' is in both" in text
    assert "give each seed of an experiment from one table" in text
    assert not (tmp_path / "twice").exists()


# -- the entropy controls' claims (top-entropy, cov, entropy-target, mask-truncated) -------------------------------
def _ent(algo: str, seed: int, final: float, entropies, **tags) -> RunData:
    """A FINISHED run with ``policy/entropy`` at steps 1, 2, ... and its final pass@1."""
    return _rd(algo, seed, final, {"policy/entropy": list(enumerate(entropies, 1))}, **tags)


def test_the_entropy_floor_of_the_claims_is_the_scenarios():
    from gspo_bench.config import load_config
    from gspo_bench.reporting.claim_specs import ENTROPY_FLOOR, ENTROPY_SESOI

    assert load_config("entropy").collapse.entropy_floor == ENTROPY_FLOOR
    target = _claim("entropy-target")
    assert target.parts[0].region == (ENTROPY_FLOOR, math.inf) and target.parts[2].region == (-math.inf, ENTROPY_FLOOR)
    assert target.parts[1].region == (ENTROPY_SESOI, math.inf)
    assert "--set loss.entropy_target=0.2" in EXPERIMENTS["claims-entropy-target"][1][0]
    assert "--preset entropy" in EXPERIMENTS["claims-entropy-target"][1][0]
    assert "--preset entropy" in EXPERIMENTS["claims-entropy"][1][0]


def test_entropy_target_by_hand():
    runs = {"claims-entropy": [], "claims-entropy-target": []}
    # lowest entropies: grpo 0.08, 0.06, 0.09, 0.07 (under the 0.1 floor); with the target 0.15, 0.16, 0.14, 0.15
    rows = ((0.08, 0.15, 0.50, 0.52), (0.06, 0.16, 0.55, 0.53), (0.09, 0.14, 0.60, 0.61), (0.07, 0.15, 0.58, 0.58))
    for s, (g, t, fg, ft) in enumerate(rows):
        runs["claims-entropy"].append(_ent("grpo", s, fg, (0.2, 0.12, g), **COV))
        runs["claims-entropy-target"].append(_ent("grpo", s, ft, (0.2, t, 0.19), tuning="entropy-target"))
    res = cl.evaluate((_claim("entropy-target"),), runs)[0]
    floor, lift, grpo, cost = res.parts
    floor_ds, lift_ds = [0.15, 0.16, 0.14, 0.15], [0.07, 0.10, 0.05, 0.08]
    assert floor.stat.mean == pytest.approx(0.15) and floor.stat.ci == pytest.approx(_t_ci(floor_ds))
    assert lift.stat.ci == pytest.approx(_t_ci(lift_ds))
    # the claim's own family: the two decisive parts, each tested against its edge (0.1 nats, 0.02 nats)
    ps = [_p_by_hand(floor_ds, (0.1, math.inf))[0], _p_by_hand(lift_ds, (0.02, math.inf))[0]]
    assert [floor.p, lift.p] == pytest.approx(ps)
    assert [floor.p_family, lift.p_family] == pytest.approx(_holm_by_hand(ps)) and max(_holm_by_hand(ps)) < 0.05
    assert floor.family == lift.family == "this claim's region tests (2)"
    assert floor.verdict == lift.verdict == cl.REPRODUCED
    assert grpo.stat.ci == pytest.approx(_t_ci([0.08, 0.06, 0.09, 0.07])) and not grpo.part.decisive
    assert grpo.p is None and grpo.verdict == cl.REPRODUCED  # the interval's reading: under the floor
    assert cost.stat.mean == pytest.approx(1 / 4) and not cost.part.decisive  # +2, -2, +1, 0 points
    assert res.verdict == cl.REPRODUCED
    # one seed with the target dipping to 0.05: the lowest entropies' interval reaches under the floor
    runs["claims-entropy-target"][1] = _ent("grpo", 1, 0.53, (0.2, 0.05, 0.19), tuning="entropy-target")
    res = cl.evaluate((_claim("entropy-target"),), runs)[0]
    dipped = [0.15, 0.05, 0.14, 0.15]
    assert res.parts[0].stat.ci == pytest.approx(_t_ci(dipped)) and res.parts[0].stat.ci[0] < 0.1
    assert res.parts[0].p == pytest.approx(_p_by_hand(dipped, (0.1, math.inf))[0])
    assert res.parts[0].verdict == cl.UNDECIDED and res.verdict == cl.UNDECIDED


def test_cov_and_truncation_and_the_retired_top_entropy_by_hand():
    runs = {"claims-entropy": [], "controls-default": [], "claims-truncation": []}
    for s in range(3):
        runs["claims-entropy"] += [_ent("grpo", s, 0.50, (0.2, 0.1), **COV),
                                   _ent("clip_cov", s, 0.51 + s / 100, (0.3, 0.2), **COV),  # mean 0.25 vs 0.15
                                   _ent("kl_cov", s, (0.40, 0.41, 0.39)[s], (0.15, 0.15), **COV)]  # 10 worse
        runs["controls-default"] += [_ent("grpo", s, 0.60, (0.3, 0.3), **DFLT),
                                     _ent("grpo", s, 0.59 - s / 100, (0.6, 0.6), tuning="top-entropy-20")]
        runs["claims-truncation"] += [
            _rd("grpo", s, 0.62, {"response/truncated_frac": [(1, 0.5), (2, 0.4)]}, tuning="cap-3"),
            _rd("grpo", s, 0.62 + (1 - s) / 100, tuning="cap-3-masked")]
    cov = cl.evaluate((_claim("cov"),), runs)[0]
    ent_clip, fin_clip, ent_kl, fin_kl = cov.parts
    # entropy ratios: the same on every seed, a tie: no test, the point decides (log10 1.67 above 0.05; 0 not)
    assert ent_clip.stat.mean == pytest.approx(math.log10(0.25 / 0.15)) and ent_clip.stat.tied
    assert ent_clip.verdict == cl.REPRODUCED and ent_clip.family.startswith("none (a tie") and ent_clip.p is None
    assert ent_kl.stat.mean == pytest.approx(0.0) and ent_kl.stat.tied and ent_kl.verdict == cl.REFUTED
    # final pass@1: claims-entropy's table against grpo, both registered as "no worse than -3"
    p_clip, in_clip = _p_by_hand([1.0, 2.0, 3.0], (-3.0, math.inf))
    p_kl, in_kl = _p_by_hand([-10.0, -9.0, -11.0], (-3.0, math.inf))
    holm = _holm_by_hand([p_clip, p_kl])
    assert in_clip and not in_kl and max(holm) < 0.05
    assert fin_clip.stat.ci == pytest.approx(_t_ci([1.0, 2.0, 3.0]))
    assert [fin_clip.p, fin_kl.p] == pytest.approx([p_clip, p_kl])
    assert [fin_clip.p_family, fin_kl.p_family] == pytest.approx(holm)
    assert fin_clip.family == "claims-entropy: 2 comparisons against grpo, final pass@1"
    assert fin_clip.verdict == cl.REPRODUCED and fin_kl.verdict == cl.REFUTED and cov.verdict == cl.REFUTED
    # top-entropy is retired: its parts shown with the intervals' readings
    top = cl.evaluate((_claim("top-entropy"),), runs)[0]
    final, entropy = top.parts
    assert top.verdict == cl.RETIRED
    assert final.stat.ci == pytest.approx(_t_ci([-1.0, -2.0, -3.0])) and final.verdict == cl.UNDECIDED  # ~[-4.5, +0.5]
    assert final.p is None and not final.part.decisive
    assert entropy.stat.mean == pytest.approx(math.log10(2)) and entropy.verdict == cl.READING
    row = cl.part_row(entropy)
    assert row[6] == "-" and row[-1] == "a reading, not in the verdict"
    assert cl.part_row(final)[-1] == "not decided (shown, not in the verdict)"
    # mask-truncated: masked - unmasked +1, 0, -1 points (two tunings of one group: no paired-table comparison),
    # inside "no worse than -3" in the claim's own family of one; the truncated fraction is a reading
    trunc = cl.evaluate((_claim("mask-truncated"),), runs)[0]
    masked, frac = trunc.parts
    assert masked.stat.ci == pytest.approx(_t_ci([1.0, 0.0, -1.0]))
    p, inside = _p_by_hand([1.0, 0.0, -1.0], (-3.0, math.inf))
    assert inside and masked.p == pytest.approx(p) == pytest.approx(masked.p_family) and p < 0.05
    assert masked.family == "this claim's region tests (1)" and masked.verdict == cl.REPRODUCED
    assert frac.stat.mean == pytest.approx(0.45) and frac.verdict == cl.READING and trunc.verdict == cl.REPRODUCED


def test_a_claims_figure_gives_each_unit_a_panel_and_an_axis_of_its_own(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from gspo_bench.reporting.claim_specs import Claim
    from gspo_bench.reporting.paired import PairedStat

    def part(label, unit, mean, ci, region):
        stat = PairedStat(n=8, mean=mean, sd=1.0, ci=ci, significant=True, mde=None)
        return cl.PartResult(Part(label, (), region, unit=unit), stat, [str(s) for s in range(8)], cl.REPRODUCED)

    parts = [part("pass@1", "points", 0.5, (-6.2, 7.1), (-5.0, math.inf)),
             part("lowest entropy", "nats", 0.144, (0.131, 0.157), (0.1, math.inf)),
             part("above grpo's", "nats", 0.059, (0.044, 0.073), (0.0, math.inf))]
    claim = Claim("k", "a claim", "src", "design", ("e",), tuple(p.part for p in parts), ())
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **kw: saved.append(self))
    cl.plot_claim(cl.ClaimResult(claim, parts, cl.REPRODUCED), {}, tmp_path / "k.png")
    [fig] = saved
    curves, points, nats = fig.axes
    assert [t.get_text() for t in points.get_yticklabels()] == ["pass@1"]
    assert [t.get_text() for t in nats.get_yticklabels()] == ["lowest entropy", "above grpo's"]
    assert "[points]" in points.get_xlabel() and "[nats]" in nats.get_xlabel()
    # the nats panel's axis spans a fraction of a nat, not the points' ±7: its intervals are readable
    assert nats.get_xlim()[1] - nats.get_xlim()[0] < 0.5 and points.get_xlim()[1] - points.get_xlim()[0] > 10


def test_a_part_on_runs_from_before_the_dev_split_says_so():
    # gspo_token vs gspo on 3 seeds; one gspo_token run logs no dev-split pass@1 (warm-started before the split)
    runs = {"claims-default": []}
    for s, (a, b) in enumerate(((0.60, 0.60), (0.61, 0.62), (0.62, 0.61))):
        runs["claims-default"] += [_rd("gspo", s, a, **DFLT), _rd("gspo_token", s, b, **DFLT)]
    res = cl.evaluate((_claim("gspo-token"),), runs)[0]
    assert not res.parts[0].before_dev_split
    old = runs["claims-default"][1]
    runs["claims-default"][1] = RunData(old.run_id, old.status, old.tags, {}, {}, old.history)
    res = cl.evaluate((_claim("gspo-token"),), runs)[0]
    assert res.parts[0].before_dev_split
    meta = {"command": "c", "commit": "x", "machine": "m", "margin": 3.0, "missing": {}}
    page = cl.markdown([res], meta, {})
    assert "; runs from before the dev split |" in page and ", on runs from before the dev split.**" in page
