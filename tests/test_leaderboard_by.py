"""``--by TAG[,TAG...]``: leaderboard rows, paired differences and report sections split by run tags.

The store, experiment ``split`` (task arith, model tiny-dense, preset default, every run FINISHED):

| run                     | routing_replay | rollout_dtype | eval/pass1 @ 0, 10, 20 per seed 0 / 1 / 2       |
|-------------------------|----------------|---------------|-------------------------------------------------|
| grpo s0, s1, s2         | none           | bfloat16      | .40 .50 .60 / .40 .45 .50 / .40 .50 .70         |
| gspo s0, s1, s2         | none           | bfloat16      | .40 .55 .70 / .40 .50 .60 / .40 .55 .65         |
| grpo s0, s1, s2         | r3             | bfloat16      | .40 .40 .30 / .40 .40 .40 / .40 .45 .35         |
| gspo s0, s1, s2         | r3             | bfloat16      | .40 .60 .80 / .40 .60 .70 / .40 .65 .75         |
| grpo s0                 | (no tag)       | (no tag)      | .40 .60 .90                                     |

By hand, final pass@1 (the step-20 value):
- none: grpo .60, .50, .70 (mean .60, sd .10); gspo .70, .60, .65 (mean .65, sd .05);
  gspo - grpo per seed: +.10, +.10, -.05, mean +.05, sd sqrt(.0075).
- r3: grpo .30, .40, .35 (mean .35, sd .05); gspo .80, .70, .75 (mean .75, sd .05);
  gspo - grpo per seed: +.50, +.30, +.40, mean +.40, sd .10,
  95 % interval .40 -/+ t(0.975, 2) * .10 / sqrt(3) = .40 -/+ .2484 = [+.152, +.648]: significant.
- no tag: grpo alone (.90), nothing to pair.
- without --by every grpo run of a seed is one group: seed 0 = mean(.60, .30, .90) = .60, so
  gspo - grpo = (.75 - .60, .65 - .45, .70 - .525) = (.15, .20, .175), mean .175.
"""

from __future__ import annotations

import csv
import io
import math

import pytest

from gspo_bench.cli.main import main
from gspo_bench.reporting.leaderboard import COLUMNS, CSV_FIELDS, collect, load_runs, render, summarise
from gspo_bench.reporting.paired_table import PAIRED_CSV_FIELDS, paired_groups, render_paired
from tests.mlflow_fakes import log_run, new_store, one_line as _one_line

EXP = "split"
EVAL_STEPS = (0, 10, 20)
T_975_2 = 4.302652729911275  # t(0.975, 2 df), from a t table
CURVES = {
    ("grpo", "none"): ((0.40, 0.50, 0.60), (0.40, 0.45, 0.50), (0.40, 0.50, 0.70)),
    ("gspo", "none"): ((0.40, 0.55, 0.70), (0.40, 0.50, 0.60), (0.40, 0.55, 0.65)),
    ("grpo", "r3"): ((0.40, 0.40, 0.30), (0.40, 0.40, 0.40), (0.40, 0.45, 0.35)),
    ("gspo", "r3"): ((0.40, 0.60, 0.80), (0.40, 0.60, 0.70), (0.40, 0.65, 0.75)),
}


def _run(client, exp_id, algo, seed, eval_, tags):
    log_run(client, exp_id, algo=algo, seed=seed, evals=list(zip(EVAL_STEPS, eval_)), tags=tags,
            metrics=[("time/wall_s", 20, 10.0)],
            params={"rollout.prompts_per_step": "4", "rollout.group_size": "2", "train.steps": "20"})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri, client, ids = new_store(tmp_path_factory, "by", EXP)
    exp = ids[EXP]
    for (algo, replay), curves in CURVES.items():
        for seed, curve in enumerate(curves):
            _run(client, exp, algo, seed, curve, {"routing_replay": replay, "rollout_dtype": "bfloat16"})
    _run(client, exp, "grpo", 0, (0.40, 0.60, 0.90), {})
    return uri


@pytest.fixture(scope="module")
def runs(store):
    return load_runs(store, EXP)


def _row(rows, algo, replay):
    (row,) = [r for r in rows if r["algo"] == algo and r["by"]["routing_replay"] == replay]
    return row


def _final(groups, replay):
    (g,) = [g for g in groups if g.key[4:] == (replay,)]
    (row,) = [r for r in g.rows if r["metric"] == "final_pass1"] or [None]
    return g, row


def test_by_splits_rows_with_hand_computed_means(store):
    rows = collect(store, EXP, by=("routing_replay",))
    assert [(r["algo"], r["by"]["routing_replay"]) for r in rows] == [
        ("grpo", "-"), ("gspo", "none"), ("grpo", "none"), ("gspo", "r3"), ("grpo", "r3")]  # best first per split
    grpo_r3 = _row(rows, "grpo", "r3")
    assert grpo_r3["n"] == 3 and grpo_r3["seeds"] == "0,1,2"
    assert grpo_r3["final_pass1"] == pytest.approx(0.35) and grpo_r3["final_pass1_std"] == pytest.approx(0.05)
    # AUC per run: (10 * (.4 + .4) / 2 + 10 * (.4 + .3) / 2) / 20 = .375, then .40 and .4125
    assert grpo_r3["auc_pass1"] == pytest.approx((0.375 + 0.40 + 0.4125) / 3)
    grpo_none = _row(rows, "grpo", "none")
    assert grpo_none["final_pass1"] == pytest.approx(0.60) and grpo_none["final_pass1_std"] == pytest.approx(0.10)
    assert grpo_none["best_pass1"] == pytest.approx(0.60)
    assert _row(rows, "gspo", "none")["final_pass1"] == pytest.approx(0.65)
    assert _row(rows, "gspo", "r3")["final_pass1"] == pytest.approx(0.75)
    untagged = _row(rows, "grpo", "-")
    assert untagged["n"] == 1 and untagged["final_pass1"] == pytest.approx(0.90)
    # two tags: their values in --by order; the untagged run has "-" for both
    two = collect(store, EXP, by=("rollout_dtype", "routing_replay"))
    assert {tuple(r["by"].items()) for r in two} == {
        (("rollout_dtype", "-"), ("routing_replay", "-")), (("rollout_dtype", "bfloat16"), ("routing_replay", "none")),
        (("rollout_dtype", "bfloat16"), ("routing_replay", "r3"))}


def test_without_by_rows_and_columns_are_unchanged(runs):
    rows = summarise(runs)
    assert all("by" not in r for r in rows) and [r["algo"] for r in rows] == ["gspo", "grpo"]
    grpo = rows[1]
    # seven runs, three seeds: each seed the mean of its runs (none, r3, untagged), the row the mean of the seeds
    per_seed = [(0.6 + 0.3 + 0.9) / 3, (0.5 + 0.4) / 2, (0.7 + 0.35) / 2]
    assert grpo["n"] == 7 and grpo["seeds"] == "0,1,2"
    assert grpo["final_pass1"] == pytest.approx(sum(per_seed) / 3)
    assert render(rows, "md").splitlines()[0] == "| " + " | ".join(COLUMNS) + " |"
    assert render(rows, "csv").splitlines()[0] == ",".join(CSV_FIELDS)
    assert render(rows, "csv") == render(summarise(runs, ()), "csv")


def test_paired_differences_are_taken_within_each_split(runs):
    groups = paired_groups(runs, "grpo", by=("routing_replay",))
    assert [g.key for g in groups] == [("arith", "tiny-dense", "default", "default", v) for v in ("-", "none", "r3")]
    g, r3 = _final(groups, "r3")
    assert r3["algo"] == "gspo" and r3["n"] == 3 and r3["seeds"] == "0,1,2" and r3["by"] == {"routing_replay": "r3"}
    assert r3["mean_diff"] == pytest.approx(0.40) and r3["sd_diff"] == pytest.approx(0.10)
    half = T_975_2 * 0.10 / math.sqrt(3)
    assert (r3["ci_low"], r3["ci_high"]) == (pytest.approx(0.40 - half), pytest.approx(0.40 + half))
    assert r3["significant"] and g.note is None
    _, none = _final(groups, "none")
    assert none["mean_diff"] == pytest.approx(0.05) and none["sd_diff"] == pytest.approx(math.sqrt(0.0075))
    assert not none["significant"]
    untagged, _ = _final(groups, "-")
    assert untagged.note == "only grpo in this group, nothing to pair"
    # without --by the seeds of all splits are mixed (a seed run twice counts as the mean of its runs)
    (whole,) = paired_groups(runs, "grpo")
    assert whole.key == ("arith", "tiny-dense", "default", "default")
    assert whole.rows[0]["mean_diff"] == pytest.approx((0.15 + 0.20 + 0.175) / 3)


def test_cli_md_has_the_tag_column_and_split_titles(store, capsys):
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "md",
                 "--by", "routing_replay"]) == 0
    board, paired = capsys.readouterr().out.split("**Paired differences vs grpo")
    assert board.startswith("| task | model | preset | config | routing_replay | algo | status |")
    assert "| arith | tiny-dense | default | default | r3 | gspo | finished | 3 (0,1,2) | 0.400 | 0.750 ± 0.050 |" in board
    assert "| arith | tiny-dense | default | default | - | grpo | finished | 1 (0) | 0.400 | 0.900 |" in board
    assert "| task | model | preset | config | routing_replay | algo | baseline |" in paired
    assert ("| arith | tiny-dense | default | default | r3 | gspo | grpo | final pass@1 (points) | 3 | +40.0 | "
            "[+15.2, +64.8] | yes |") in paired
    assert "| default | none | gspo | grpo | final pass@1 (points) | 3 | +5.0 |" in paired
    assert "- arith / tiny-dense / routing_replay=r3: MDE (final pass@1, 3 seeds" in paired
    assert "- arith / tiny-dense / routing_replay=-: no paired differences vs grpo: only grpo" in paired
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "table",
                 "--by", "routing_replay"]) == 0
    assert "routing_replay" in capsys.readouterr().out


def test_cli_csv_has_the_tag_columns(store, capsys):
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "csv",
                 "--by", "routing_replay,rollout_dtype"]) == 0
    text = capsys.readouterr().out
    head = text.splitlines()[0].split(",")
    assert head[:7] == ["task", "model", "preset", "config", "routing_replay", "rollout_dtype", "algo"]
    back = list(csv.DictReader(io.StringIO(text)))
    r3 = next(r for r in back if r["algo"] == "gspo" and r["routing_replay"] == "r3")
    assert r3["rollout_dtype"] == "bfloat16" and float(r3["final_pass1"]) == pytest.approx(0.75)
    assert {(r["routing_replay"], r["rollout_dtype"]) for r in back if r["algo"] == "grpo"} == {
        ("-", "-"), ("none", "bfloat16"), ("r3", "bfloat16")}
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "csv", "--paired",
                 "--by", "routing_replay"]) == 0
    back = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(back[0])[:6] == ["task", "model", "preset", "config", "routing_replay", "algo"]
    final = {r["routing_replay"]: float(r["mean_diff"]) for r in back if r["metric"] == "final_pass1"}
    assert final == {"none": pytest.approx(0.05), "r3": pytest.approx(0.40)}
    # without --by the paired CSV keeps its columns
    assert render_paired(paired_groups(load_runs(store, EXP)), "csv").splitlines()[0] == ",".join(PAIRED_CSV_FIELDS)


@pytest.mark.parametrize("cmd", ["leaderboard", "report"])
def test_cli_unknown_tag_is_one_line_exit_2(cmd, store, tmp_path, capsys):
    out = ["--out", str(tmp_path / "r")] if cmd == "report" else []
    assert main([cmd, "--tracking-uri", store, "--experiment", EXP, "--by", "routing", *out]) == 2
    text = _one_line(capsys)
    assert "--by 'routing': no run in the selection has this tag" in text
    assert "routing_replay" in text and "rollout_dtype" in text and "algo" in text and "seed" in text
    assert main([cmd, "--tracking-uri", store, "--experiment", EXP, "--by", "routing_replay,task", *out]) == 2
    assert "--by 'task': already a leaderboard column" in _one_line(capsys)
    assert not (tmp_path / "r").exists()


def test_report_by_writes_distinct_figures_per_split(store, tmp_path):
    out = tmp_path / "rep"
    assert main(["report", "--tracking-uri", store, "--experiment", EXP, "--by", "routing_replay",
                 "--out", str(out)]) == 0
    names = {p.name for p in out.glob("*.png")}
    splits = ("routing-replay-none", "routing-replay-r3", "no-routing-replay")
    assert names == {f"{kind}_arith_tiny-dense_{s}.png" for kind in ("eval", "clip") for s in splits} | {
        f"paired_arith_tiny-dense_{s}.png" for s in splits[:2]} | {  # the untagged split has grpo alone: no pairs
        "splits_arith_tiny-dense.png"}  # and one figure comparing the splits
    md = (out / "report.md").read_text()
    assert "| task | model | preset | config | routing_replay | algo |" in md
    r3 = md[md.index("## arith / tiny-dense / routing_replay=r3\n"):]
    assert "Preset `default`, config `default`, routing_replay `r3`; 6 finished runs" in r3
    assert "| r3 | gspo | grpo | final pass@1 (points) | 3 | +40.0 | [+15.2, +64.8] | yes |" in r3
    assert "](eval_arith_tiny-dense_routing-replay-r3.png)" in r3
    assert "## arith / tiny-dense / routing_replay=none\n" in md and "## arith / tiny-dense / routing_replay=-\n" in md
    # and without --by one section, as before
    plain = tmp_path / "plain"
    assert main(["report", "--tracking-uri", store, "--experiment", EXP, "--out", str(plain)]) == 0
    assert {p.name for p in plain.glob("*.png")} == {"eval_arith_tiny-dense.png", "clip_arith_tiny-dense.png",
                                                       "paired_arith_tiny-dense.png"}


def test_reserved_columns_are_the_leaderboard_and_paired_csv_columns():
    from gspo_bench.reporting.grouping import RESERVED_COLUMNS
    from gspo_bench.reporting.leaderboard import CSV_FIELDS
    from gspo_bench.reporting.paired_table import PAIRED_CSV_FIELDS

    assert RESERVED_COLUMNS == {*CSV_FIELDS, *PAIRED_CSV_FIELDS, "tuning", "by"}
