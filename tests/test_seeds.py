"""The one rule for several runs of one (algorithm, seed), by hand, and the same count in every view that uses it.

The runs (task arith, model tiny-dense, preset default; eval/pass1 at steps 0, 10, 20), tag ``replay``:

| algo | replay | seed | lr | eval/pass1        | final | +10 pts at |
|------|--------|------|----|-------------------|-------|------------|
| grpo | none   | 0    | 1  | .40 .45 .50       | .50   | 20         |
| grpo | none   | 1    | 1  | .40 .50 .60       | .60   | 10         |
| gspo | none   | 0    | 1  | .40 .55 .70       | .70   | 10         |
| gspo | none   | 0    | 2  | .40 .45 .45       | .45   | never      |
| gspo | none   | 1    | 1  | .40 .525 .65      | .65   | 10         |
| gspo | r3     | 0    | 1  | .40 .60 .80       | .80   | 10         |
| gspo | r3     | 1    | 1  | .40 .575 .75      | .75   | 10         |

plus an older run of gspo/none/seed 1/lr 1 set aside as SUPERSEDED (final .99), which no view counts.
gspo/none/seed 0 holds two runs of different settings (lr 1 and 2): by the rule it is one seed with final
(.70 + .45) / 2 = .575 and no steps to +10 pts (the lr-2 run never got there).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gspo_bench.reporting import claims
from gspo_bench.reporting.frame import SUPERSEDED, RunData
from gspo_bench.reporting.paired_table import paired_groups
from gspo_bench.reporting.seeds import RUNS, per_seed, run_table
from gspo_bench.reporting.split_pairs import split_pair_groups
from gspo_bench.reporting.suite_summary import finals_of

STEPS = (0, 10, 20)


def _run(algo, replay, seed, lr, curve, status="FINISHED"):
    tags = {"algo": algo, "seed": str(seed), "task": "arith", "model": "tiny-dense", "preset": "default",
            "replay": replay, "lr": lr}
    return RunData(f"{algo}-{replay}-{seed}-{lr}-{status}", status, tags, {}, {},
                   {"eval/pass1": list(zip(STEPS, curve))})


ALL = [_run("grpo", "none", 0, "1", (0.40, 0.45, 0.50)), _run("grpo", "none", 1, "1", (0.40, 0.50, 0.60)),
         _run("gspo", "none", 0, "1", (0.40, 0.55, 0.70)), _run("gspo", "none", 0, "2", (0.40, 0.45, 0.45)),
         _run("gspo", "none", 1, "1", (0.40, 0.525, 0.65)), _run("gspo", "r3", 0, "1", (0.40, 0.60, 0.80)),
         _run("gspo", "r3", 1, "1", (0.40, 0.575, 0.75)),
         _run("gspo", "none", 1, "1", (0.40, 0.99, 0.99), status=SUPERSEDED)]


def _final_and_steps(rows, algo):
    got = {r["metric"]: r for r in rows if r["algo"] == algo}
    return got["final_pass1"], got["steps_to_10"]


def test_per_seed_is_the_mean_of_its_runs_and_missing_when_one_lacks_the_value():
    table = pd.DataFrame({"algo": ["a", "a", "a", "b"], "seed": ["0", "0", "1", "0"],
                          "final": [0.5, 0.7, 0.6, 0.4], "steps": [10.0, math.nan, 20.0, None]})
    got = per_seed(table, ["algo"])
    assert list(got.index) == [("a", "0"), ("a", "1"), ("b", "0")]
    assert got.loc[("a", "0"), "final"] == pytest.approx(0.6) and math.isnan(got.loc[("a", "0"), "steps"])
    assert got.loc[("a", "1"), "steps"] == 20.0 and math.isnan(got.loc[("b", "0"), "steps"])
    assert list(got[RUNS]) == [2, 1, 1]
    # only FINISHED runs with a seed tag take part
    no_seed = RunData("x", "FINISHED", {"algo": "grpo"}, {}, {})
    assert list(run_table([*ALL, no_seed], lambda r: {"id": r.run_id})["id"]) == [r.run_id for r in ALL[:-1]]


def test_the_paired_table_counts_a_seed_run_twice_once_by_the_rule():
    (none, r3) = paired_groups(ALL, "grpo", by=("replay",))
    final, steps = _final_and_steps(none.rows, "gspo")
    # d_s = gspo - grpo: seed 0 .575 - .50 = .075, seed 1 .65 - .60 = .05 (not three pairs)
    assert (final["n"], final["common"], final["seeds"]) == (2, 2, "0,1")
    assert final["mean_diff"] == pytest.approx((0.075 + 0.05) / 2)
    # steps to +10 pts: seed 0 has none (one of its runs never got there); seed 1: gspo crosses at 8
    # (0.40 -> 0.525 reaches 0.50 at 0.8 of the way), grpo at 10
    assert (steps["n"], steps["seeds"]) == (1, "1") and steps["mean_diff"] == pytest.approx(8 - 10)
    assert r3.note == "no FINISHED grpo run in this group"


def test_the_split_table_counts_a_seed_run_twice_once_by_the_rule():
    (g,) = split_pair_groups(ALL, "replay", "none", ("replay",))
    final, steps = _final_and_steps(g.rows, "gspo")
    # d_s = r3 - none: seed 0 .80 - .575 = .225, seed 1 .75 - .65 = .10
    assert (final["n"], final["seeds"]) == (2, "0,1")
    assert final["mean_diff"] == pytest.approx((0.225 + 0.10) / 2)
    assert (steps["n"], steps["seeds"]) == (1, "1")


def test_the_suite_ranking_counts_a_seed_run_twice_once_by_the_rule():
    finals = finals_of(ALL, ["grpo", "gspo", "ppo"])
    # the suite reads one scenario, splits mixed: gspo seed 0 = (.70 + .45 + .80) / 3, seed 1 = (.65 + .75) / 2
    assert finals["grpo"] == pytest.approx({"0": 0.50, "1": 0.60})
    assert finals["gspo"] == pytest.approx({"0": 0.65, "1": 0.70}) and finals["ppo"] == {}


def test_the_claims_refuse_a_seed_the_rule_counts_two_runs_for():
    assert sorted(claims.select(ALL, (("algo", "gspo"), ("replay", "r3")))) == ["0", "1"]
    assert claims.select(ALL, (("algo", "gspo"), ("replay", "none"), ("lr", "1")))["1"].status == "FINISHED"
    with pytest.raises(ValueError, match="two FINISHED runs match .* at seed 0: gspo-none-0-1-FINISHED and "
                                         "gspo-none-0-2-FINISHED"):
        claims.select(ALL, (("algo", "gspo"), ("replay", "none")))


from hypothesis import given, settings  # noqa: E402
from tests.conftest import examples  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gspo_bench.reporting.frame import newest_counts  # noqa: E402

_RUN = st.tuples(st.sampled_from(["grpo", "gspo"]), st.sampled_from(["0", "1"]), st.sampled_from(["aa", "bb"]),
                 st.sampled_from(["FINISHED", "FAILED"]), st.integers(0, 5))


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(_RUN, max_size=12), st.booleans())
def test_newest_counts_keeps_one_finished_run_per_settings_algorithm_and_seed_the_newest(specs, timed):
    runs = [RunData(f"r{i}", status, {"algo": algo, "seed": seed, "gspo_bench.config": digest}, {}, {},
                    start_time=float(t) if timed else None)
            for i, (algo, seed, digest, status, t) in enumerate(specs)]
    before = [r.status for r in runs]
    newest_counts(runs)
    for i, r in enumerate(runs):
        if before[i] != "FINISHED":
            assert r.status == before[i]  # only FINISHED runs are ever set aside
            continue
        def key(q):
            return q.algo, q.seed, q.tags["gspo_bench.config"]

        same = [j for j, q in enumerate(runs) if before[j] == "FINISHED" and key(q) == key(r)]
        # the newest: the latest start time, the first listed of equal ones (or of runs without start times)
        keep = max(same, key=lambda j: (runs[j].start_time or 0.0, -j))
        assert r.status == ("FINISHED" if i == keep else SUPERSEDED), (specs, timed)


def _outcome(pass1: str, steps: str) -> dict:
    return {"resolved.warmstart.pass1": pass1, "resolved.warmstart.dev_pass1": "0.42",
            "resolved.warmstart.steps": steps, "loss.eps_low": "0.2"}


def test_a_run_made_again_where_the_warm_start_came_out_otherwise_supersedes_the_older_one():
    # grpo seed 5 on two machines: one command, two warm-start outcomes, so two digests; the newer counts
    old = RunData("old", "FINISHED", {"algo": "grpo", "seed": "5", "gspo_bench.config": "aa"},
                  _outcome("0.48", "499"), {}, start_time=1.0)
    new = RunData("new", "FINISHED", {"algo": "grpo", "seed": "5", "gspo_bench.config": "bb"},
                  _outcome("0.46", "309"), {}, start_time=2.0)
    # another setting (not only the warm start differs): step 2 of the rule, both stay
    other = RunData("other", "FINISHED", {"algo": "grpo", "seed": "5", "gspo_bench.config": "cc"},
                    {**_outcome("0.48", "499"), "loss.eps_low": "0.3"}, {}, start_time=0.5)
    # no warm start logged (runs without params): digests alone decide, as before
    bare = [RunData(f"b{i}", "FINISHED", {"algo": "gspo", "seed": "5", "gspo_bench.config": d}, {}, {},
                    start_time=float(i)) for i, d in enumerate(("aa", "bb"))]
    newest_counts([old, new, other, *bare])
    assert [r.status for r in (old, new, other, *bare)] == [SUPERSEDED, "FINISHED", "FINISHED", "FINISHED",
                                                            "FINISHED"]


def test_mixed_warm_starts_names_a_seed_whose_runs_began_from_two():
    from gspo_bench.reporting.frame import mixed_warm_starts

    tags = {"task": "calc", "model": "tiny-dense", "preset": "tools"}
    runs = [RunData(f"{a}{s}", "FINISHED", {"algo": a, "seed": s, **tags}, _outcome(p, n), {})
            for a, s, p, n in (("grpo", "4", "0.41", "303"), ("gspo", "4", "0.41", "303"),
                               ("grpo", "5", "0.46", "309"), ("gspo", "5", "0.48", "499"))]
    said = mixed_warm_starts(runs)
    assert "calc/tiny-dense seed 5" in said and "seed 4" not in said
    runs[3].status = "FAILED"  # only counted runs take part
    assert mixed_warm_starts(runs) == ""
