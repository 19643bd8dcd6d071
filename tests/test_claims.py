"""``reporting/claims.py`` and ``claims``: measures, pairing across experiments, verdicts by hand, the page."""

import math

import pytest
from mlflow_fakes import log_run, new_store, one_line

from gspo_bench.cli.main import main
from gspo_bench.reporting import claims as cl
from gspo_bench.reporting.claim_specs import EXPERIMENTS, Part, Term, claims
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
    assert len(specs) == 8 and len({c.key for c in specs}) == 8
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
    assert set(cl.needed_metrics(specs)) == {"eval/pass1", "clip/frac", "mismatch/kl", "policy/entropy"}


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
