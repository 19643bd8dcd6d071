"""``--baseline TAG=VALUE``: paired differences between splits of one algorithm, seed by seed.

The store holds two experiments (task arith, model tiny-dense, preset default, every run FINISHED; eval/pass1
at steps 0, 10, 20 = .40, the midpoint, the final value):

``grid``: grpo and gspo x routing_replay none | r3 x seeds 0, 1, 2, final pass@1 per seed 0 / 1 / 2:

| algo | none          | r3            | r3 - none per seed | mean | sd  |
|------|---------------|---------------|--------------------|------|-----|
| grpo | .60 .50 .70   | .70 .55 .85   | +.10 +.05 +.15     | +.10 | .05 |
| gspo | .40 .45 .50   | .60 .60 .75   | +.20 +.15 +.25     | +.20 | .05 |

95 % t interval: mean -/+ t(0.975, 2) * .05 / sqrt(3) = mean -/+ 4.3027 * .028868 = mean -/+ .12421:
grpo [-.0242, +.2242] (contains 0: not significant), gspo [+.0758, +.3242] (significant).
AUC = (a + 2 mid + c) / 4 with mid = (a + c) / 2 and a = .40 is .20 + final / 2, so the AUC differences
are half the final ones: grpo +.05, gspo +.10.
Without TAG=VALUE, --baseline grpo pairs gspo with grpo within each split: none -.20 / -.05 / -.20, r3 -.10 /
+.05 / -.10.

``grid2``: the ``grid`` runs tagged correction=none, plus correction=tis runs: grpo none .50 .60 .55, grpo r3
.30 .40 .35 (r3/tis - none/tis = -.20 -.20 -.20, mean -.20, sd 0: the interval is the point), and gspo r3 only
(no gspo none/tis: a note row).
"""

from __future__ import annotations

import csv
import io
import math

import pytest

from gspo_bench.cli.main import main
from gspo_bench.reporting.leaderboard import load_runs, summarise
from gspo_bench.reporting.paired_table import paired_groups, render_paired, render_with_paired
from gspo_bench.reporting.split_pairs import (check_split_value, parse_split_baseline, render_split_pairs,
                                              split_pair_groups)
from gspo_bench.config import ConfigError
from tests.mlflow_fakes import log_run, new_store, one_line as _one_line

T_975_2 = 4.3027  # t(0.975, 2 df), from a t table
HALF = T_975_2 * 0.05 / math.sqrt(3)
FINALS = {("grpo", "none"): (0.60, 0.50, 0.70), ("grpo", "r3"): (0.70, 0.55, 0.85),
          ("gspo", "none"): (0.40, 0.45, 0.50), ("gspo", "r3"): (0.60, 0.60, 0.75)}
TIS = {("grpo", "none"): (0.50, 0.60, 0.55), ("grpo", "r3"): (0.30, 0.40, 0.35), ("gspo", "r3"): (0.70, 0.70, 0.70)}


def _run(client, exp_id, algo, seed, final, tags):
    curve = (0.40, (0.40 + final) / 2, final)
    log_run(client, exp_id, algo=algo, seed=seed, evals=list(zip((0, 10, 20), curve)), tags=tags)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri, client, ids = new_store(tmp_path_factory, "splitpairs", "grid", "grid2")
    grid, grid2 = ids["grid"], ids["grid2"]
    for (algo, replay), finals in FINALS.items():
        for seed, final in enumerate(finals):
            _run(client, grid, algo, seed, final, {"routing_replay": replay})
            _run(client, grid2, algo, seed, final, {"routing_replay": replay, "correction": "none"})
    for (algo, replay), finals in TIS.items():
        for seed, final in enumerate(finals):
            _run(client, grid2, algo, seed, final, {"routing_replay": replay, "correction": "tis"})
    return uri


def _rows(groups, metric="final_pass1"):
    (g,) = groups
    return {(r["algo"], *r["by"].values()): r for r in g.rows if r["metric"] == metric}


def _cli(store, *args, exp="grid"):
    return main(["leaderboard", "--tracking-uri", store, "--experiment", exp, *args])


def test_r3_vs_none_matches_the_hand_computation(store):
    by = ("routing_replay",)
    groups = split_pair_groups(load_runs(store, "grid"), "routing_replay", "none", by)
    assert [g.key for g in groups] == [("arith", "tiny-dense", "default", "default")] and groups[0].note is None
    final = _rows(groups)
    assert set(final) == {("grpo", "r3"), ("gspo", "r3")}  # the none splits are baselines, never compared
    grpo, gspo = final["grpo", "r3"], final["gspo", "r3"]
    for row, mean in ((grpo, 0.10), (gspo, 0.20)):
        assert row["n"] == 3 and row["seeds"] == "0,1,2" and row["baseline"] == "routing_replay=none"
        assert row["baseline_split"] == "routing_replay=none" and row["note"] is None
        assert row["mean_diff"] == pytest.approx(mean) and row["sd_diff"] == pytest.approx(0.05)
        assert row["ci_low"] == pytest.approx(mean - HALF, abs=1e-4)
        assert row["ci_high"] == pytest.approx(mean + HALF, abs=1e-4)
        assert row["mde"] is not None and row["mde"] > HALF
    assert not grpo["significant"] and gspo["significant"]  # grpo's interval [-.024, +.224] contains 0
    # the one multiplicity rule: Holm over the group's two (algorithm, split) comparisons of final pass@1.
    # t = mean / (.05 / sqrt(3)): grpo 3.464, gspo 6.928 on 2 df; Holm: the smaller p x 2, then the larger x 1
    # (never below the one before)
    from scipy.stats import t as student

    p_grpo, p_gspo = (2 * student.sf(m / (0.05 / math.sqrt(3)), 2) for m in (0.10, 0.20))
    assert grpo["p"] == pytest.approx(p_grpo) and gspo["p"] == pytest.approx(p_gspo)
    assert gspo["p_holm"] == pytest.approx(2 * p_gspo) and gspo["p_holm"] < 0.05  # 0.040: decided
    assert grpo["p_holm"] == pytest.approx(max(p_grpo, 2 * p_gspo)) and grpo["p_holm"] > 0.05
    assert groups[0].mde_alpha == pytest.approx(0.025) and groups[0].mde_tested == 2
    assert grpo["mde_alpha"] == pytest.approx(0.025)
    auc = _rows(groups, "auc_pass1")
    assert auc["grpo", "r3"]["mean_diff"] == pytest.approx(0.05) and auc["gspo", "r3"]["mean_diff"] == pytest.approx(0.10)


def test_md_output_has_title_and_rows(store, capsys):
    assert _cli(store, "--by", "routing_replay", "--baseline", "routing_replay=none", "--format", "md") == 0
    out = capsys.readouterr().out
    board, paired = out.split("**Paired differences vs routing_replay=none (same algorithm, same seed)")
    assert board.startswith("| task | model | preset | config | routing_replay | algo |")
    assert "| task | model | preset | config | algo | routing_replay | vs | metric |" in paired
    assert ("| arith | tiny-dense | default | default | gspo | r3 | routing_replay=none | final pass@1 (points) | "
            "3 | +20.0 | [+7.6, +32.4] | yes | 0.0202 | 0.0404 |") in paired
    assert ("| arith | tiny-dense | default | default | grpo | r3 | routing_replay=none | final pass@1 (points) | "
            "3 | +10.0 | [-2.4, +22.4] | no |") in paired
    assert ("- arith / tiny-dense: MDE (final pass@1, 3 seeds, α 0.025 = 0.05 / 2, Holm's first step, 80 % power)"
            in paired and "over 2 algorithm x split" in paired)
    assert "vs grpo" not in out
    assert _cli(store, "--by", "routing_replay", "--baseline", "routing_replay=none", "--format", "table") == 0
    assert "same algorithm, same seed" in capsys.readouterr().out


def test_paired_csv_columns(store, capsys):
    assert _cli(store, "--by", "routing_replay", "--baseline", "routing_replay=none", "--paired",
                "--format", "csv") == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split(",") == [
        "task", "model", "preset", "config", "algo", "routing_replay", "baseline", "baseline_split", "metric", "n",
        "common", "seeds", "mean_diff", "sd_diff", "ci_low", "ci_high", "significant", "p", "p_holm", "mde",
        "mde_alpha", "note"]
    back = list(csv.DictReader(io.StringIO(text)))
    assert len(back) == 2 * 3  # 2 algorithms x 1 compared split x 3 metrics
    final = {r["algo"]: r for r in back if r["metric"] == "final_pass1"}
    assert float(final["gspo"]["mean_diff"]) == pytest.approx(0.20)
    assert float(final["grpo"]["ci_low"]) == pytest.approx(0.10 - HALF, abs=1e-4)
    assert (final["gspo"]["significant"], final["grpo"]["significant"]) == ("true", "false")
    assert {r["routing_replay"] for r in back} == {"r3"} and {r["note"] for r in back} == {""}
    # the CSV without --paired is the leaderboard alone
    assert _cli(store, "--by", "routing_replay", "--baseline", "routing_replay=none", "--format", "csv") == 0
    assert "final_pass1_std" in capsys.readouterr().out.splitlines()[0]


def test_other_tags_held_equal_and_missing_baseline_split_is_a_note_row(store):
    by = ("routing_replay", "correction")
    groups = split_pair_groups(load_runs(store, "grid2"), "routing_replay", "none", by)
    (g,) = groups
    final = _rows(groups)
    assert set(final) == {("grpo", "r3", "none"), ("grpo", "r3", "tis"), ("gspo", "r3", "none")}
    assert final["grpo", "r3", "none"]["mean_diff"] == pytest.approx(0.10)  # r3/none vs none/none
    tis = final["grpo", "r3", "tis"]  # r3/tis vs none/tis, never vs none/none
    assert tis["baseline_split"] == "routing_replay=none, correction=tis"
    assert tis["mean_diff"] == pytest.approx(-0.20) and tis["sd_diff"] == pytest.approx(0.0, abs=1e-12)
    assert tis["significant"]
    (note,) = [r for r in g.rows if r["note"]]
    assert (note["algo"], note["by"]) == ("gspo", {"routing_replay": "r3", "correction": "tis"})
    assert note["note"] == "no baseline split: no FINISHED gspo run with routing_replay=none, correction=tis"
    md = render_split_pairs(groups, "md")
    assert ("| gspo | r3 | tis | routing_replay=none, correction=tis | no baseline split: no FINISHED gspo run "
            "with routing_replay=none, correction=tis | 0 |") in md
    back = list(csv.DictReader(io.StringIO(render_split_pairs(groups, "csv"))))
    assert [r["metric"] for r in back if r["note"]] == [""]


def test_plain_algorithm_baseline_is_unchanged(store, capsys):
    runs = load_runs(store, "grid")
    by = ("routing_replay",)
    groups = paired_groups(runs, "grpo", by=by)
    assert _cli(store, "--by", "routing_replay", "--baseline", "grpo", "--format", "md") == 0
    out = _tables(capsys.readouterr().out)
    assert out == render_with_paired(summarise(runs, by), "md", groups, "grpo")
    assert "**Paired differences vs grpo: per seed, algo - grpo" in out and "same algorithm" not in out
    assert "| r3 | gspo | grpo | final pass@1 (points) | 3 | -5.0 |" in out
    assert _cli(store, "--by", "routing_replay", "--baseline", "grpo", "--paired", "--format", "csv") == 0
    assert capsys.readouterr().out == render_paired(groups, "csv")
    assert _cli(store, "--format", "md") == 0  # no --baseline, no --by: as before
    assert _tables(capsys.readouterr().out) == render_with_paired(summarise(runs), "md", paired_groups(runs), "grpo")
    assert parse_split_baseline("grpo", by) is None and parse_split_baseline(None, by) is None


def _tables(out: str) -> str:
    """The printed tables without the notes under them (these runs predate the dev split: one such note)."""
    return "".join(line for line in out.splitlines(keepends=True) if not line.startswith("note: "))


@pytest.mark.parametrize("cmd", ["leaderboard", "report"])
def test_bad_tag_or_value_is_one_line_exit_2(cmd, store, tmp_path, capsys):
    out = ["--out", str(tmp_path / "r")] if cmd == "report" else []
    base = [cmd, "--tracking-uri", store, "--experiment", "grid", *out]
    assert main([*base, "--by", "routing_replay", "--baseline", "correction=none"]) == 2
    text = _one_line(capsys)
    assert "--baseline 'correction=none': 'correction' is not a --by tag (--by is routing_replay)" in text
    assert main([*base, "--baseline", "routing_replay=none"]) == 2  # no --by at all
    assert "'routing_replay' is not a --by tag (no --by given)" in _one_line(capsys)
    assert main([*base, "--by", "routing_replay", "--baseline", "routing_replay=r2"]) == 2
    text = _one_line(capsys)
    assert "--baseline routing_replay=r2: no run in the selection has routing_replay='r2' (its values: none, r3)" in text
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="its values: none, r3"):
        check_split_value(load_runs(store, "grid"), "routing_replay", "r1")


def test_report_holds_the_split_table(store, tmp_path):
    out = tmp_path / "rep"
    assert main(["report", "--tracking-uri", store, "--experiment", "grid", "--by", "routing_replay",
                 "--baseline", "routing_replay=none", "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    section = md[md.index("## Splits compared: arith / tiny-dense"):]
    assert "### Paired differences vs routing_replay=none (same algorithm, same seed)" in section
    assert "| algo | routing_replay | vs | metric | pairs (n) |" in section
    assert "| gspo | r3 | routing_replay=none | final pass@1 (points) | 3 | +20.0 | [+7.6, +32.4] | yes |" in section
    assert "### (f) Paired differences vs grpo" in md  # the per-split sections stay vs the default algorithm
