"""``reporting/claims.py`` and ``claims``: measures, pairing across experiments, verdicts by hand, the page."""

import math

import pytest
from mlflow_fakes import log_run, new_store, one_line

from gspo_bench.cli.main import main
from gspo_bench.reporting import claims as cl
from gspo_bench.reporting.claim_specs import EXPERIMENTS, SUITE_ALGOS, Part, Term, claims
from gspo_bench.reporting.frame import RunData
from scipy.stats import t as student_t


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


def test_every_claim_names_known_experiments_and_terms():
    specs = claims(2.0)
    assert len(specs) == 16 and len({c.key for c in specs}) == 16
    for c in specs:
        used = {t.experiment for p in c.parts for t in p.terms} | {cv.experiment for cv in c.curves}
        assert used <= set(c.experiments) <= set(EXPERIMENTS), c.key
    eq = next(c for c in specs if c.key == "gspo-token").parts[0]
    assert eq.region == (-2.0, 2.0)
    # DAPO's ablations: full DAPO (arith-default) minus DAPO with one part off (dapo-ablation), per seed
    parts = next(c for c in specs if c.key == "dapo-parts").parts
    for part, off in zip(parts, ("no-dynamic-sampling", "no-clip-higher")):
        full, ablated = part.terms
        assert (full.experiment, full.sign, dict(full.where)) == ("arith-default", 1, {
            "algo": "dapo", "preset": "default", "tuning": "default"})
        assert (ablated.experiment, ablated.sign, dict(ablated.where)) == ("dapo-ablation", -1, {
            "algo": "dapo", "tuning": off})
        assert part.region == (0.0, math.inf) and part.decisive
    # every history a measure or a figure reads is loaded (the entropy reading of clip-higher included)
    assert set(cl.needed_metrics(specs)) == {"eval/pass1", "clip/frac", "mismatch/kl", "policy/entropy",
                                             "response/length_wrong_mean", "response/length_mean",
                                             "response/truncated_frac"}
    # a part with no region (a reading) is never decisive: it has nothing to test
    assert all(not p.decisive for c in specs for p in c.parts if p.region == (-math.inf, math.inf))


def test_claims_command_writes_the_page(tmp_path_factory, tmp_path, capsys):
    uri, client, ids = new_store(tmp_path_factory, "claims", "arith-default")
    tags = {"tuning": "default"}
    # gspo_token tracks gspo within 0.4 points on every seed; cispo at step 20 is far below dapo at step 40
    for s, base in enumerate((0.40, 0.42, 0.41, 0.43)):
        for algo, fin in (("gspo", .60), ("gspo_token", .604), ("grpo", .58), ("dapo", .65), ("cispo", .62)):
            evals = [(0, base), (20, base + (0.05 if algo == "cispo" else 0.1)), (40, fin + s / 100)]
            log_run(client, ids["arith-default"], algo=algo, seed=s, evals=evals, tags=tags)
    out = tmp_path / "page" / "claims.md"
    assert main(["claims", "--tracking-uri", uri, "--out", str(out)]) == 0
    page = out.read_text()
    printed = capsys.readouterr().out
    assert "GSPO-token equals GSPO" in printed and "-> reproduced" in printed
    row = next(line for line in page.splitlines() if line.startswith("| final pass@1, gspo_token - gspo"))
    assert "| +0.4 | [+0.4, +0.4] |" in row and row.endswith("| reproduced |")
    assert "**Verdict: refuted" in page.split("CISPO reaches")[2]  # 0.45+ vs 0.65+: -16 points on every seed
    assert "not run" in page and "experiment 'suite-long' not found" in page
    assert (out.parent / "claims" / "claim-gspo-token.png").stat().st_size > 1000
    assert not (out.parent / "claims" / "claim-stability.png").exists()  # nothing measured, no figure


def test_claims_command_bad_input(tmp_path_factory, capsys):
    uri, _, _ = new_store(tmp_path_factory, "claims-bad", "arith-default")
    assert main(["claims", "--tracking-uri", uri, "--source", "nope=sqlite:///x.db"]) == 2
    assert "EXPERIMENT one of" in one_line(capsys)
    assert main(["claims", "--tracking-uri", uri, "--margin", "-1"]) == 2
    assert "--margin must be > 0" in one_line(capsys)
    assert main(["claims", "--tracking-uri", "sqlite:////nonexistent/dir/m.db"]) == 2
    assert "no database file" in one_line(capsys)


# -- the newer losses' claims (sapo, vespo-stale, dppo-stale, dr-grpo-length) ------------------------------------
SIX = {"grpo", "ppo", "dapo", "gspo", "gspo_token", "cispo"}
DFLT = {"preset": "default", "tuning": "default"}


def _rd(algo: str, seed: int, final: float, hist: dict | None = None, **tags) -> RunData:
    """A FINISHED run: eval/pass1 0.40 at step 0 and ``final`` at step 40, plus the histories ``hist``."""
    return RunData(f"{algo}{seed}{tags}", "FINISHED", {"algo": algo, "seed": str(seed), **tags}, {}, {},
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
        ((0.0, math.inf), "points", True), ((-2.0, math.inf), "points", True), ((-math.inf, 0.0), "log10", False)]
    assert [(t.experiment, dict(t.where), t.measure, t.sign) for t in sapo.parts[0].terms] == [
        ("arith-default", {"algo": "sapo", **DFLT}, "final", 1),
        ("arith-default", {"algo": "grpo", **DFLT}, "final", -1)]
    assert [(t.experiment, t.where, t.sign) for t in sapo.parts[1].terms] == [
        ("suite-hot", (("algo", "sapo"),), 1), ("suite-hot", (("algo", "gspo"),), -1)]
    assert {t.measure for t in sapo.parts[2].terms} == {"log10:clip/frac"}
    assert [c.label for c in sapo.curves] == ["default grpo", "default sapo", "hot gspo", "hot sapo"]
    # VESPO: a difference of differences (stale minus default) and a plain offpolicy difference, both decisive
    did, off = vespo.parts
    assert [(t.experiment, dict(t.where)["algo"], t.sign) for t in did.terms] == [
        ("suite-stale", "vespo", 1), ("suite-stale", "grpo", -1), ("arith-default", "vespo", -1),
        ("arith-default", "grpo", 1)]
    assert [(t.experiment, dict(t.where)["algo"], t.sign) for t in off.terms] == [
        ("suite-offpolicy", "vespo", 1), ("suite-offpolicy", "grpo", -1)]
    assert did.region == off.region == (0.0, math.inf) and did.decisive and off.decisive
    # DPPO: the same design for each divergence, four decisive parts
    assert len(dppo.parts) == 4 and all(p.decisive and p.region == (0.0, math.inf) for p in dppo.parts)
    assert [dict(p.terms[0].where)["algo"] for p in dppo.parts] == ["dppo_tv", "dppo_tv", "dppo_kl", "dppo_kl"]
    assert [c.label for c in dppo.curves] == ["stale grpo", "stale dppo_tv", "stale dppo_kl"]
    # Dr. GRPO: shorter wrong answers and pass@1 at least as good decide; the overall length is shown
    assert dr.experiments == ("suite-long",) and dr.curve_metric == "response/length_wrong_mean"
    assert [(p.terms[0].measure, p.region, p.unit, p.decisive) for p in dr.parts] == [
        ("log10:response/length_wrong_mean", (-math.inf, 0.0), "log10", True),
        ("final", (-2.0, math.inf), "points", True),
        ("log10:response/length_mean", (-math.inf, 0.0), "log10", False)]
    assert [dict(t.where)["algo"] for p in dr.parts for t in p.terms] == ["dr_grpo", "grpo"] * 3


def test_every_experiment_names_the_commands_that_made_its_runs():
    import re

    for name, (what, cmds) in EXPERIMENTS.items():
        assert isinstance(cmds, tuple) and cmds and all(isinstance(c, str) and c.startswith("python -m gspo_bench ")
                                                        for c in cmds), name
    # a suite experiment: one suite command over its scenario, naming every algorithm a claim reads there
    used: dict[str, set] = {}
    for c in claims():
        for t in [t for p in c.parts for t in p.terms] + list(c.curves):
            used.setdefault(t.experiment, set()).add(dict(t.where)["algo"])
    for name in ("suite-hot", "suite-stale", "suite-offpolicy", "suite-long", "suite-entropy"):
        cmds = EXPERIMENTS[name][1]
        (cmd,) = cmds
        assert re.search(r"--scenarios (\S+)", cmd).group(1) == name.removeprefix("suite-"), cmd
        named = set(re.search(r"--algos (\S+)", cmd).group(1).split(","))
        assert named == set(SUITE_ALGOS[name.removeprefix("suite-")].split(","))
        assert used[name] == named, (name, used[name] ^ named)  # every cell run is read, every cell read is run
    assert {"sapo"} <= used["suite-hot"] and {"vespo", "dppo_tv", "dppo_kl"} <= used["suite-stale"]
    assert len(EXPERIMENTS["dapo-ablation"][1]) == 2  # one command per part switched off


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


def test_dr_grpo_length_by_hand():
    # dr_grpo's wrong answers shorter on every seed (means 30, 25, 20; seed 1 has no wrong answer at step 2,
    # seed 2 none after step 1: a step without the key is no value, not a zero)
    short = {0: [(1, 30.0), (2, 30.0)], 1: [(1, 25.0), (3, 25.0)], 2: [(1, 20.0)]}
    res = cl.evaluate((_claim("dr-grpo-length"),), _long_runs(short, GRPO_WRONG))[0]
    wrong, final, length = res.parts
    ds = [math.log10(30 / 45), math.log10(25 / 50), math.log10(20 / 40)]
    assert wrong.seeds == ["0", "1", "2"]
    assert wrong.stat.mean == pytest.approx(sum(ds) / 3)
    assert wrong.stat.ci == pytest.approx(_t_ci(ds))
    assert wrong.stat.ci[1] < 0 and wrong.verdict == cl.REPRODUCED  # about [-0.44, -0.08]: 0.36x to 0.83x
    # final pass@1 in points: 1, 1, 2 -> interval about [-0.1, +2.8], inside "at least as well" (> -3)
    assert final.stat.mean == pytest.approx(4 / 3) and final.stat.ci == pytest.approx(_t_ci([1.0, 1.0, 2.0]))
    assert final.verdict == cl.REPRODUCED
    # all responses: dr_grpo 50 vs 40 tokens on every seed, log10 1.25 > 0: refuted, but it is not decisive
    assert length.stat.mean == pytest.approx(math.log10(1.25)) and length.verdict == cl.REFUTED
    assert res.verdict == cl.REPRODUCED
    # dr_grpo's wrong answers about twice as long on every seed (means 90, 110, 80): the claim is refuted
    longer = {0: [(1, 90.0)], 1: [(1, 100.0), (2, 120.0)], 2: [(1, 80.0)]}
    res = cl.evaluate((_claim("dr-grpo-length"),), _long_runs(longer, GRPO_WRONG))[0]
    ds = [math.log10(90 / 45), math.log10(110 / 50), math.log10(80 / 40)]
    assert res.parts[0].stat.ci == pytest.approx(_t_ci(ds)) and res.parts[0].stat.ci[0] > 0
    assert res.parts[0].verdict == cl.REFUTED and res.verdict == cl.REFUTED
    # grpo runs made before the metric existed: that part is not run, naming why; half measured is not decided
    res = cl.evaluate((_claim("dr-grpo-length"),), _long_runs(short, {}))[0]
    assert res.parts[0].verdict == cl.NOT_RUN and res.parts[0].missing == (
        "no seed has every term measured (no run has log10:response/length_wrong_mean of algo=grpo in suite-long)")
    assert res.parts[1].verdict == cl.REPRODUCED and res.verdict == cl.UNDECIDED


def test_sapo_by_hand():
    runs = {"arith-default": [], "suite-hot": []}
    for s, (g, p) in enumerate(((0.55, 0.60), (0.57, 0.61), (0.56, 0.62))):
        runs["arith-default"] += [_rd("grpo", s, g, {"clip/frac": [(1, 0.01), (2, 0.01)]}, **DFLT),
                                  _rd("sapo", s, p, {"clip/frac": [(1, 0.002), (2, 0.0)]}, **DFLT),
                                  _rd("sapo", s, 0.1, tuning="other")]  # another tuning: never picked
    for s, (g, p) in enumerate(((0.50, 0.49), (0.52, 0.50), (0.54, 0.55))):
        runs["suite-hot"] += [_rd("gspo", s, g), _rd("sapo", s, p), _rd("grpo", s, 0.02)]
    res = cl.evaluate((_claim("sapo"),), runs)[0]
    default, hot, clip = res.parts
    # default: 5, 4, 6 points -> [+2.5, +7.5], above 0
    assert default.stat.mean == pytest.approx(5.0) and default.stat.ci == pytest.approx(_t_ci([5.0, 4.0, 6.0]))
    assert default.verdict == cl.REPRODUCED
    # hot: -1, -2, +1 points -> about [-4.5, +3.1], straddling -3: not decided, and so is the claim
    assert hot.stat.ci == pytest.approx(_t_ci([-1.0, -2.0, 1.0])) and hot.stat.ci[0] < -3 < hot.stat.ci[1]
    assert hot.verdict == cl.UNDECIDED and res.verdict == cl.UNDECIDED
    # clip/frac: sapo's mean 0.001 vs grpo's 0.01 on every seed: log10 ratio -1
    assert clip.stat.mean == pytest.approx(-1.0) and clip.verdict == cl.REPRODUCED and not clip.part.decisive
    # a wider margin takes the hot interval inside "at least as well": the claim is reproduced
    assert cl.evaluate((_claim("sapo", delta=5.0),), runs)[0].verdict == cl.REPRODUCED


def _stale_runs(finals: dict) -> dict:
    """The three experiments' runs from ``finals[algo] = (stale, default, offpolicy)`` final pass@1 per seed 0-2."""
    runs = {"suite-stale": [], "arith-default": [], "suite-offpolicy": []}
    for algo, (stale, dflt, off) in finals.items():
        for s in range(3):
            runs["suite-stale"].append(_rd(algo, s, stale[s]))
            runs["arith-default"].append(_rd(algo, s, dflt[s], **DFLT))
            runs["suite-offpolicy"].append(_rd(algo, s, off[s]))
    return runs


def test_vespo_and_dppo_under_staleness_by_hand():
    finals = {  # algo: (stale, default, offpolicy) final pass@1 per seed 0, 1, 2
        "grpo": ((0.40, 0.42, 0.44), (0.55, 0.56, 0.57), (0.50, 0.50, 0.50)),
        "vespo": ((0.50, 0.50, 0.53), (0.56, 0.57, 0.57), (0.53, 0.54, 0.52)),
        "dppo_tv": ((0.45, 0.47, 0.49), (0.55, 0.56, 0.57), (0.52, 0.52, 0.52)),
        "dppo_kl": ((0.30, 0.31, 0.33), (0.56, 0.56, 0.58), (0.51, 0.51, 0.51)),
    }
    runs = _stale_runs(finals)
    vespo, dppo = cl.evaluate((_claim("vespo-stale"), _claim("dppo-stale")), runs)
    # vespo: (50 - 40) - (56 - 55) = 9, (50 - 42) - (57 - 56) = 7, (53 - 44) - (57 - 57) = 9
    assert vespo.parts[0].stat.mean == pytest.approx(25 / 3)
    assert vespo.parts[0].stat.ci == pytest.approx(_t_ci([9.0, 7.0, 9.0]))
    # offpolicy: 3, 4, 2 -> [+0.5, +5.5]
    assert vespo.parts[1].stat.ci == pytest.approx(_t_ci([3.0, 4.0, 2.0]))
    assert [p.verdict for p in vespo.parts] == [cl.REPRODUCED] * 2 and vespo.verdict == cl.REPRODUCED
    # dppo_tv: +5 on every seed under staleness, +2 offpolicy; dppo_kl: (30 - 40) - (56 - 55) = -11, -11, -12
    # under staleness (refuted), +1 offpolicy
    tv_did, tv_off, kl_did, kl_off = dppo.parts
    assert tv_did.stat.mean == pytest.approx(5.0) and tv_off.stat.mean == pytest.approx(2.0)
    assert kl_did.stat.mean == pytest.approx(-34 / 3) and kl_did.stat.ci[1] < 0
    assert kl_off.stat.mean == pytest.approx(1.0)
    assert [p.verdict for p in dppo.parts] == [cl.REPRODUCED, cl.REPRODUCED, cl.REFUTED, cl.REPRODUCED]
    assert dppo.verdict == cl.REFUTED  # one decisive part refuted refutes the claim
    # without the default's dppo runs the differences of differences are not run; offpolicy alone decides nothing
    runs["arith-default"] = [r for r in runs["arith-default"] if not r.tags["algo"].startswith("dppo")]
    dppo = cl.evaluate((_claim("dppo-stale"),), runs)[0]
    assert [p.verdict for p in dppo.parts] == [cl.NOT_RUN, cl.REPRODUCED, cl.NOT_RUN, cl.REPRODUCED]
    assert "no FINISHED run of arith-default with algo=dppo_tv" in dppo.parts[0].missing
    assert dppo.verdict == cl.UNDECIDED


def test_page_names_every_command_and_new_claims_not_run():
    results = cl.evaluate(claims(), {})
    meta = {"command": "python -m gspo_bench claims", "commit": "abc", "machine": "m", "margin": 3.0,
            "missing": {e: f"experiment {e!r} not found" for e in EXPERIMENTS}}
    page = cl.markdown(results, meta, {})
    assert all(r.verdict == cl.NOT_RUN for r in results)
    sections = page.split("\n## ")[1:]
    assert len(sections) == 16
    sapo = next(s for s in sections if s.startswith("9. SAPO's soft gate"))
    assert "**Verdict: not run.**" in sapo and "arXiv 2511.20347" in sapo
    # each command of an experiment is its own item under it
    assert "  - `python -m gspo_bench suite --scenarios hot --algos grpo,gspo,sapo --seeds 3`" in sapo
    dr = next(s for s in sections if s.startswith("12. Dropping GRPO's std"))
    assert "arXiv 2503.20783" in dr and "  - `python -m gspo_bench suite --scenarios long --algos grpo,gspo,dr_grpo " \
        "--seeds 3`" in dr
    assert "  - `python -m gspo_bench run --algos all --seed 0,1,2,3,4,5,6,7 --experiment arith-default`" in sapo
    for key in ("vespo-stale", "dppo-stale"):
        text = next(s for s in sections if _claim(key).text in s.split("\n")[0])
        for scenario in ("stale", "offpolicy"):
            assert (f"  - `python -m gspo_bench suite --scenarios {scenario} --algos grpo,gspo,vespo,dppo_tv,dppo_kl "
                    "--seeds 3`") in text and "not run" in text


def test_claims_command_with_only_some_new_experiments(tmp_path_factory, tmp_path, capsys):
    uri, client, ids = new_store(tmp_path_factory, "claims-new", "arith-default", "suite-long")
    # suite-long: dr_grpo's wrong answers 20 tokens vs grpo's 40, pass@1 +1 point; no sapo run anywhere
    for s in range(3):
        for algo, wrong, fin in (("grpo", 40.0, 0.50), ("dr_grpo", 20.0 + s, 0.51)):
            metrics = [("response/length_wrong_mean", st, wrong) for st in (1, 2, 3)]
            metrics += [("response/length_mean", st, wrong - 5) for st in (1, 2, 3)]
            log_run(client, ids["suite-long"], algo=algo, seed=s, evals=[(0, 0.40), (40, fin + s / 100)],
                    tags={"preset": "long"}, metrics=metrics)
        log_run(client, ids["arith-default"], algo="grpo", seed=s, evals=[(0, 0.40), (40, 0.55)],
                tags={"tuning": "default"})
    out = tmp_path / "claims.md"
    assert main(["claims", "--tracking-uri", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wrong answers stop growing longer. -> reproduced" in printed
    assert "SAPO's soft gate keeps more learning signal than hard clipping, and is at least as stable as GSPO. " \
           "-> not run" in printed
    page = out.read_text()
    row = next(line for line in page.splitlines() if line.startswith("| long: log10 wrong-answer length ratio"))
    ds = [math.log10((20 + s) / 40) for s in range(3)]
    lo, hi = _t_ci(ds)
    assert f"[{lo:+.2f}, {hi:+.2f}]" in row and row.endswith("| reproduced |")
    assert "no FINISHED run of arith-default with algo=sapo" in page
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


def _outside_p_by_hand(ds: list[float], lo: float) -> float:
    """2 P(T_{n-1} <= (mean - lo) / se): the test that the mean lies below ``lo``, two-sided-equivalent."""
    n, mean = len(ds), sum(ds) / len(ds)
    sd = math.sqrt(sum((d - mean) ** 2 for d in ds) / (n - 1))
    return min(1.0, 2 * student_t.cdf((mean - lo) / (sd / math.sqrt(n)), n - 1))


def test_a_part_that_is_a_paired_table_comparison_takes_the_tables_holm_verdict():
    from gspo_bench.reporting.paired_table import paired_groups

    # sapo ends 2, 3, 2.5 ... points below grpo on 4 seeds: its own interval lies below 0, so on its own the claim
    # "sapo ends ahead" would be refuted; but the default task holds 12 algorithms against grpo, and the table's
    # Holm adjustment over them leaves it undecided. Both pages must say the same.
    runs = {"arith-default": [], "suite-hot": []}
    others = ["a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10", "a11"]
    sapo = (-0.020, -0.030, -0.025, -0.005)
    for s in range(4):
        runs["arith-default"].append(_rd("grpo", s, 0.60 + s / 100, **DFLT))
        runs["arith-default"].append(_rd("sapo", s, 0.60 + s / 100 + sapo[s], **DFLT))
        for i, a in enumerate(others):  # noise around grpo, no effect
            runs["arith-default"].append(_rd(a, s, 0.60 + s / 100 + ((i + s) % 3 - 1) / 100, **DFLT))
    res = cl.evaluate((_claim("sapo"),), runs)[0]
    part = res.parts[0]
    ds = [100 * d for d in sapo]
    assert part.stat.ci == pytest.approx(_t_ci(ds)) and part.stat.ci[1] < 0  # on its own: below 0
    row = next(r for g in paired_groups(runs["arith-default"]) for r in g.rows
               if r["algo"] == "sapo" and r["metric"] == "final_pass1")
    assert part.p == pytest.approx(row["p"]) and part.p_family == pytest.approx(row["p_holm"])
    assert row["p"] < 0.05 < row["p_holm"]
    assert part.verdict == cl.UNDECIDED and "12 algorithms against grpo" in part.family
    assert part.mde == pytest.approx(100 * row["mde"]) and part.mde_alpha == pytest.approx(0.05 / 12)
    # the same differences with grpo and sapo alone: a family of one, decided below 0, so refuted
    alone = {"arith-default": [r for r in runs["arith-default"] if r.algo in ("grpo", "sapo")], "suite-hot": []}
    part = cl.evaluate((_claim("sapo"),), alone)[0].parts[0]
    assert part.verdict == cl.REFUTED and part.p_family == pytest.approx(part.p)
    assert part.p == pytest.approx(2 * student_t.cdf(part.stat.mean / (part.stat.sd / 2), 3))


def test_a_table_comparison_whose_terms_pin_settings_is_that_splits_row_not_an_average_over_settings():
    from gspo_bench.reporting.paired_table import paired_groups

    # moe-stabilisers holds grpo and gspo under four (routing_replay, correction) settings; the part "moe bf16, no
    # replay: gspo - grpo" names none/none, so it is the none/none split's row of `report --by
    # routing_replay,correction` (its p, Holm p over that split's 2 algorithms, MDE), whatever the other settings do
    lead = {"none": (0.010, 0.030, 0.020), "r3": (-0.05, 0.08, -0.01), "r2": (0.04, -0.06, 0.0),
            "tis": (0.09, -0.02, 0.05)}
    runs = {"moe-stabilisers": [], "suite-stale": [], "arith-default": []}
    for setting, tags in {"none": ("none", "none"), "r3": ("r3", "none"), "r2": ("r2", "none"),
                          "tis": ("none", "tis")}.items():
        tag = {**DFLT, "routing_replay": tags[0], "correction": tags[1]}
        for s in range(3):
            runs["moe-stabilisers"].append(_rd("grpo", s, 0.60 + s / 50, **tag))
            runs["moe-stabilisers"].append(_rd("gspo", s, 0.60 + s / 50 + lead[setting][s], **tag))
            runs["moe-stabilisers"].append(_rd("cispo", s, 0.61 + s / 50 + (s % 2) / 100, **tag))
    part = next(r for r in cl.evaluate((_claim("mismatch"),), runs)[0].parts if r.part.label.startswith("moe"))
    assert part.stat.ci == pytest.approx(_t_ci([1.0, 3.0, 2.0]))
    [group] = [g for g in paired_groups(runs["moe-stabilisers"], by=("correction", "routing_replay"))
               if g.key[4:] == ("none", "none")]
    row = next(r for r in group.rows if r["algo"] == "gspo" and r["metric"] == "final_pass1")
    assert part.p == pytest.approx(row["p"]) and part.p_family == pytest.approx(row["p_holm"])
    assert part.mde == pytest.approx(100 * row["mde"]) and part.mde_alpha == pytest.approx(0.05 / 2)
    assert part.family == ("moe-stabilisers, correction=none, routing_replay=none: 2 algorithms against grpo, "
                           "final pass@1")


def test_other_parts_form_the_pages_family_and_holm_decides_a_refutation():
    # dppo: two differences of differences (stale vs default, the page's own region tests, claimed above 0) and
    # two offpolicy comparisons (paired-table comparisons with grpo: their table's family)
    finals = {  # algo: (stale, default, offpolicy) final pass@1 per seed 0, 1, 2
        "grpo": ((0.40, 0.42, 0.44), (0.55, 0.56, 0.57), (0.50, 0.50, 0.50)),
        "dppo_tv": ((0.35, 0.39, 0.38), (0.55, 0.56, 0.57), (0.51, 0.53, 0.52)),
        "dppo_kl": ((0.36, 0.39, 0.39), (0.56, 0.56, 0.58), (0.51, 0.52, 0.50)),
    }
    runs = _stale_runs(finals)
    dppo = cl.evaluate((_claim("dppo-stale"),), runs)[0]
    tv_did, tv_off, kl_did, kl_off = dppo.parts
    # tv: (35 - 40) - 0, (39 - 42) - 0, (38 - 44) - 0; kl: (36 - 40) - 1, (39 - 42) - 0, (39 - 44) - 1
    ds = [-5.0, -3.0, -6.0]
    assert tv_did.stat.mean == pytest.approx(-14 / 3) == kl_did.stat.mean
    assert tv_did.part.region == (0.0, math.inf) and tv_did.stat.ci[1] < 0  # each outside on its own
    p_raw = _outside_p_by_hand(ds, 0.0)
    assert tv_did.p == pytest.approx(p_raw) == kl_did.p and p_raw < 0.05
    # Holm over the page's two region tests: both p equal, each doubled, above 0.05: neither refuted
    assert tv_did.p_family == pytest.approx(2 * p_raw) == kl_did.p_family and 2 * p_raw > 0.05
    assert tv_did.family == kl_did.family == "this page's 2 region tests"
    assert tv_did.verdict == kl_did.verdict == cl.UNDECIDED and dppo.verdict != cl.REFUTED
    assert tv_did.mde_alpha == pytest.approx(0.025)
    assert tv_off.family == "suite-offpolicy: 2 algorithms against grpo, final pass@1"
    # a stronger effect in one of them (kl: -11, -11, -12) is refuted at the family's level, and refutes the claim
    runs["suite-stale"] = [r if r.algo != "dppo_kl" else _rd("dppo_kl", int(r.seed), (0.30, 0.31, 0.33)[int(r.seed)])
                           for r in runs["suite-stale"]]
    dppo = cl.evaluate((_claim("dppo-stale"),), runs)[0]
    kl_did = dppo.parts[2]
    assert kl_did.p_family == pytest.approx(2 * _outside_p_by_hand([-11.0, -11.0, -12.0], 0.0))
    assert kl_did.verdict == cl.REFUTED and dppo.verdict == cl.REFUTED


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
    assert tv["sd"] == pytest.approx(sd) and tv["level"] == pytest.approx(0.025)  # the page's 2 region tests
    assert tv["seeds"] == seeds_needed(sd, 3.0, 0.025) and tv["sd_ci"] == pytest.approx(sd_interval(sd, 3))
    assert tv["seeds_range"] == tuple(seeds_needed(x, 3.0, 0.025) for x in sd_interval(sd, 3))
    assert 3 < tv["seeds"] < tv["seeds_range"][1]
    text = cl.render_plan(plan, 3.0)
    assert "| dppo-stale | stale vs default: (dppo_tv - grpo) - (dppo_tv - grpo) | points | 3 |" in text
    # the command: printed, no page written; a target of 0 is one line and exit 2
    out = tmp_path / "c.md"
    assert main(["claims", "--runs", "results/claims/runs.csv.gz", "--target-mde", "5", "--out", str(out)]) == 0
    assert "Seeds to detect 5" in capsys.readouterr().out and not out.exists()
    assert main(["claims", "--runs", "results/claims/runs.csv.gz", "--target-mde", "0"]) == 2
    assert "--target-mde 0" in one_line(capsys)


def test_claims_joins_runs_tables_one_experiment_each(tmp_path_factory, tmp_path, capsys):
    """``--runs A --runs B``: each experiment from the table that holds it, the joined table written beside the
    page; an experiment in two tables is one line and exit 2, before any page."""
    from gspo_bench.reporting.frame import read_frame

    uri, client, ids = new_store(tmp_path_factory, "claims-join", "arith-default", "suite-long")
    for s in range(3):
        for algo, fin in (("gspo", .60), ("gspo_token", .601 + s / 1000)):
            log_run(client, ids["arith-default"], algo=algo, seed=s, evals=[(0, 0.40), (40, fin)],
                    tags={"tuning": "default"})
        for algo, fin in (("grpo", .50), ("gspo", .52 + s / 100)):
            log_run(client, ids["suite-long"], algo=algo, seed=s, evals=[(0, 0.40), (40, fin)],
                    tags={"preset": "long"})
    empty, _, _ = new_store(tmp_path_factory, "claims-join-empty", "other")
    tables = {}
    for name in ("arith-default", "suite-long"):  # one table per experiment, as two stores would give
        page = tmp_path / name / "claims.md"
        assert main(["claims", "--source", f"{name}={uri}", "--tracking-uri", empty, "--out", str(page)]) == 0
        tables[name] = page.parent / "claims" / "runs.csv.gz"
        assert set(read_frame(tables[name])["experiment"]) == {name}
    capsys.readouterr()
    out = tmp_path / "joined" / "claims.md"
    assert main(["claims", "--runs", str(tables["arith-default"]), "--runs", str(tables["suite-long"]),
                 "--out", str(out)]) == 0
    page = out.read_text()
    gspo_token = next(line for line in page.splitlines() if line.startswith("| final pass@1, gspo_token - gspo"))
    assert "| 3 (0,1,2) | +0.2 |" in gspo_token  # (0.1 + 0.2 + 0.3) / 3 points, from the first table
    long_row = next(line for line in page.splitlines() if line.startswith("| long: final pass@1, gspo - grpo"))
    assert "| 3 (0,1,2) | +3.0 |" in long_row  # (2 + 3 + 4) / 3 points, from the second
    joined = read_frame(out.parent / "claims" / "runs.csv.gz")
    assert set(joined["experiment"]) == {"arith-default", "suite-long"}
    assert joined["run_id"].nunique() == 12
    capsys.readouterr()
    assert main(["claims", "--runs", str(tables["suite-long"]), "--runs", str(out.parent / "claims" / "runs.csv.gz"),
                 "--out", str(tmp_path / "twice" / "claims.md")]) == 2
    text = one_line(capsys)
    assert "experiment 'suite-long' is in both" in text and "give each experiment from one table" in text
    assert not (tmp_path / "twice").exists()


# -- the entropy controls' claims (top-entropy, cov, entropy-target, mask-truncated) -------------------------------
def _ent(algo: str, seed: int, final: float, entropies, **tags) -> RunData:
    """A FINISHED run with ``policy/entropy`` at steps 1, 2, ... and its final pass@1."""
    return _rd(algo, seed, final, {"policy/entropy": list(enumerate(entropies, 1))}, **tags)


def test_the_entropy_floor_of_the_claims_is_the_scenarios():
    from gspo_bench.config import load_config
    from gspo_bench.reporting.claim_specs import ENTROPY_FLOOR

    assert load_config("entropy").collapse.entropy_floor == ENTROPY_FLOOR
    target = _claim("entropy-target")
    assert target.parts[0].region == (ENTROPY_FLOOR, math.inf) and target.parts[2].region == (-math.inf, ENTROPY_FLOOR)
    assert "--set loss.entropy_target=0.2" in EXPERIMENTS["entropy-target"][1][0]
    assert "--preset entropy" in EXPERIMENTS["entropy-target"][1][0]


def test_entropy_target_by_hand():
    runs = {"suite-entropy": [], "entropy-target": []}
    # lowest entropies: grpo 0.08, 0.06, 0.09 (under the 0.1 floor); with the target 0.15, 0.17, 0.14
    for s, (g, t, fg, ft) in enumerate(((0.08, 0.15, 0.50, 0.52), (0.06, 0.17, 0.55, 0.53), (0.09, 0.14, 0.60, 0.61))):
        runs["suite-entropy"].append(_ent("grpo", s, fg, (0.2, 0.12, g)))
        runs["entropy-target"].append(_ent("grpo", s, ft, (0.2, t, 0.19), tuning="entropy-target"))
    res = cl.evaluate((_claim("entropy-target"),), runs)[0]
    floor, lift, grpo, cost = res.parts
    assert floor.stat.mean == pytest.approx(0.46 / 3) and floor.stat.ci == pytest.approx(_t_ci([0.15, 0.17, 0.14]))
    assert floor.stat.ci[0] > 0.1 and floor.verdict == cl.REPRODUCED  # about [0.116, 0.191]
    assert lift.stat.ci == pytest.approx(_t_ci([0.07, 0.11, 0.05])) and lift.verdict == cl.REPRODUCED
    assert grpo.stat.ci == pytest.approx(_t_ci([0.08, 0.06, 0.09])) and not grpo.part.decisive
    assert cost.stat.mean == pytest.approx(1 / 3) and not cost.part.decisive  # +2, -2, +1 points
    assert res.verdict == cl.REPRODUCED
    # one seed with the target dipping to 0.05: the lowest entropies' interval reaches under the floor
    runs["entropy-target"][1] = _ent("grpo", 1, 0.53, (0.2, 0.05, 0.19), tuning="entropy-target")
    res = cl.evaluate((_claim("entropy-target"),), runs)[0]
    assert res.parts[0].stat.ci == pytest.approx(_t_ci([0.15, 0.05, 0.14])) and res.parts[0].stat.ci[0] < 0.1
    assert res.parts[0].verdict == cl.UNDECIDED and res.verdict == cl.UNDECIDED


def test_cov_and_top_entropy_and_truncation_by_hand():
    runs = {"suite-entropy": [], "controls-default": [], "truncation-long": []}
    for s in range(3):
        runs["suite-entropy"] += [_ent("grpo", s, 0.50, (0.2, 0.1)),
                                  _ent("clip_cov", s, 0.51 + s / 100, (0.3, 0.2)),  # mean 0.25 vs 0.15
                                  _ent("kl_cov", s, 0.40, (0.15, 0.15))]  # entropy the same, 10 points worse
        runs["controls-default"] += [_ent("grpo", s, 0.60, (0.3, 0.3), **DFLT),
                                     _ent("grpo", s, 0.59 - s / 100, (0.6, 0.6), tuning="top-entropy-20")]
        long_tags = {"preset": "long", "tuning": "default"}
        runs["truncation-long"] += [
            _rd("grpo", s, 0.62, {"response/truncated_frac": [(1, 0.02), (2, 0.0)]}, **long_tags),
            _rd("grpo", s, 0.62 + (1 - s) / 100, tuning="mask-truncated")]
    cov = cl.evaluate((_claim("cov"),), runs)[0]
    ent_clip, fin_clip, ent_kl, fin_kl = cov.parts
    assert ent_clip.stat.mean == pytest.approx(math.log10(0.25 / 0.15)) and ent_clip.verdict == cl.REPRODUCED
    assert fin_clip.stat.ci == pytest.approx(_t_ci([1.0, 2.0, 3.0])) and fin_clip.verdict == cl.REPRODUCED
    assert ent_kl.stat.mean == pytest.approx(0.0) and ent_kl.stat.tied and ent_kl.verdict == cl.REFUTED
    assert fin_kl.stat.mean == pytest.approx(-10.0) and fin_kl.verdict == cl.REFUTED and cov.verdict == cl.REFUTED
    top = cl.evaluate((_claim("top-entropy"),), runs)[0]
    final, entropy = top.parts
    assert final.stat.ci == pytest.approx(_t_ci([-1.0, -2.0, -3.0])) and final.verdict == cl.UNDECIDED  # ~[-4.5, +0.5]
    assert entropy.stat.mean == pytest.approx(math.log10(2)) and entropy.verdict == cl.READING
    row = cl.part_row(entropy)
    assert row[6] == "-" and row[-1] == "a reading, not in the verdict"
    trunc = cl.evaluate((_claim("mask-truncated"),), runs)[0]
    masked, frac = trunc.parts
    assert masked.stat.ci == pytest.approx(_t_ci([1.0, 0.0, -1.0])) and masked.verdict == cl.REPRODUCED
    assert frac.stat.mean == pytest.approx(0.01) and frac.verdict == cl.READING and trunc.verdict == cl.REPRODUCED


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
