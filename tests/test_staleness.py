"""The staleness grid's page: each (correction, algorithm) at eta against itself on policy, paired by seed, the
region test and Holm by hand, the collapse events read from the runs, and the command end to end on a runs table."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from scipy.stats import ttest_1samp

from gspo_bench.cli.main import main
from gspo_bench.reporting import staleness as st
from gspo_bench.reporting.frame import RunData, read_frame
from gspo_bench.reporting.staleness_grid import CORRECTIONS, ETAS, cells, command, experiment
from tests.mlflow_fakes import one_line


def _empty_grid() -> dict:
    return {(c, a, e): st.Cell(c, a, e, {}) for e, c in cells() for a in CORRECTIONS[c].algos}


def _region_p(ds: list[float], lo: float) -> tuple[float, bool]:
    """The symmetric test of (lo, inf) by hand: the two-sided interval at level p touches lo from one side."""
    p_in = min(1.0, 2 * ttest_1samp(ds, lo, alternative="greater").pvalue)
    p_out = min(1.0, 2 * ttest_1samp(ds, lo, alternative="less").pvalue)
    return (p_in, True) if p_in <= p_out else (p_out, False)


def test_each_cell_is_paired_with_its_own_eta_0_and_holm_runs_over_the_page():
    grid = _empty_grid()
    base = {"0": 70.0, "1": 72.0, "2": 74.0, "3": 71.0}
    grid["naive", "grpo", 0].finals = base
    # eta 2: d = -10, -12, -11, -9 (falls); eta 4: d = 0.5, -0.5, 0.2, 0.1 (holds); eta 8: one seed (no interval)
    grid["naive", "grpo", 2].finals = {"0": 60.0, "1": 60.0, "2": 63.0, "3": 62.0}
    grid["naive", "grpo", 4].finals = {"0": 70.5, "1": 71.5, "2": 74.2, "3": 71.1}
    grid["naive", "grpo", 8].finals = {"0": 50.0}
    # tis gspo at eta 2 misses seed 3: only the seeds both cells hold are paired
    grid["tis", "gspo", 0].finals = dict(base)
    grid["tis", "gspo", 2].finals = {"0": 69.0, "1": 73.0, "2": 72.0}
    rows = st.grid_rows(grid, margin=3.0)
    assert len(rows) == sum(len(c.algos) for c in CORRECTIONS.values()) * (len(ETAS) - 1)
    by = {(r.cell.correction, r.cell.algo, r.cell.eta): r for r in rows}
    falls, holds, one = by["naive", "grpo", 2], by["naive", "grpo", 4], by["naive", "grpo", 8]
    tis = by["tis", "gspo", 2]
    assert falls.stat.mean == pytest.approx(-10.5) and holds.stat.mean == pytest.approx(0.075)
    assert tis.seeds == ["0", "1", "2"] and tis.stat.mean == pytest.approx((-1.0 + 1.0 - 2.0) / 3)
    assert one.stat.n == 1 and one.p is None and one.verdict == st.UNDECIDED
    tests = [_region_p([-10.0, -12.0, -11.0, -9.0], -3.0), _region_p([0.5, -0.5, 0.2, 0.1], -3.0),
             _region_p([-1.0, 1.0, -2.0], -3.0)]
    assert (falls.p, holds.p, tis.p) == pytest.approx([t[0] for t in tests])
    # Holm over the three tests the page has (the empty cells and the single seed are not in the family)
    ps = [t[0] for t in tests]
    order = sorted(range(3), key=lambda i: ps[i])
    adjusted, running = [0.0] * 3, 0.0
    for j, i in enumerate(order):
        running = max(running, min(1.0, (3 - j) * ps[i]))
        adjusted[i] = running
    assert (falls.p_holm, holds.p_holm, tis.p_holm) == pytest.approx(adjusted)
    assert falls.verdict == st.FALLS and holds.verdict == st.HOLDS
    assert tis.verdict == (st.HOLDS if adjusted[2] < 0.05 else st.UNDECIDED)
    assert all(r.p is None for r in rows if r.stat.n < 2)
    words = st.summary_lines(rows)
    assert "- `naive` grpo: holds at eta 4; falls at eta 2 (-10.5 points); not decided at the other etas." in words
    assert "- `m2po` cispo: not run." in words


def _run(algo: str, seed: int, finals: list[float], collapse: dict | None = None, status: str = "FINISHED"):
    history = {"eval/pass1": [(i * 10, v) for i, v in enumerate(finals)], **(collapse or {})}
    return RunData(f"{algo}-{seed}", status, {"algo": algo, "seed": str(seed)}, {}, {}, history)


def test_collect_reads_final_pass1_and_collapse_events_per_seed():
    runs = {experiment(4, "naive"): [
        _run("grpo", 0, [0.4, 0.7]), _run("grpo", 1, [0.4, 0.6], {"collapse/ratio_explosion": [(12, 1.0)]}),
        _run("gspo", 0, [0.4, 0.65]), _run("grpo", 2, [0.4, 0.9], status="FAILED")]}
    grid = st.collect(runs)
    cell = grid["naive", "grpo", 4]
    assert cell.finals == pytest.approx({"0": 70.0, "1": 60.0})  # the FAILED run is no seed of the cell
    assert cell.collapses == {"1": [("ratio_explosion", 12)]}
    assert st._collapse_text(cell) == "1/2 seeds: ratio_explosion x1 (first at step 12)"
    assert grid["naive", "gspo", 4].finals == pytest.approx({"0": 65.0}) and grid["naive", "cispo", 4].finals == {}


def _table(path, rows: list[tuple]) -> None:
    lines = ["run_id,status,experiment,artifact_uri,tags.algo,tags.seed,metric,step,value"]
    lines += [",".join(map(str, r)) for r in rows]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))


def test_the_command_writes_the_page_its_figure_and_runs_table_and_reads_them_back(tmp_path, capsys):
    rows = []
    for eta, ds in ((0, (0.70, 0.72, 0.74)), (8, (0.60, 0.61, 0.65))):
        for seed, v in enumerate(ds):
            rid = f"e{eta}s{seed}"
            rows += [(rid, "FINISHED", experiment(eta, "naive"), "", "grpo", seed, "eval/pass1", s, x)
                     for s, x in ((0, 0.4), (40, v))]
    table = tmp_path / "in.csv.gz"
    _table(table, rows)
    out = tmp_path / "page" / "README.md"
    assert main(["staleness", "--runs", str(table), "--out", str(out)]) == 0
    page = out.read_text()
    assert command(8, "m2po") in page and "python -m gspo_bench staleness --runs" in page
    assert "The page reads 6 FINISHED runs, made at commit `?`." in page  # the table holds no git.commit tag
    assert "| naive | grpo | 72.0 (3) | - (0) | - (0) | 62.0 (3) |" in page
    assert "| naive | grpo | 8 | 3 | -10.0 |" in page
    assert (out.parent / "staleness.png").stat().st_size > 0 and (out.parent / "runs.csv.gz").is_file()
    capsys.readouterr()
    # the page's own table reads back to the same page (but its command line)
    again = tmp_path / "again" / "README.md"
    assert main(["staleness", "--runs", str(out.parent / "runs.csv.gz"), "--out", str(again)]) == 0
    strip = lambda t: t.split("\n", 3)[3]  # noqa: E731
    assert strip(again.read_text()) == strip(page)


def test_two_rounds_tables_join_by_seed_and_a_seed_in_both_is_one_line_exit_2(tmp_path, capsys):
    """A later round's seeds, trained into a store of their own, join the first round's table (``--runs A --runs
    B``): the cells and the paired rows count both rounds' seeds; a seed of a cell in both tables is refused."""
    def table(name: str, seeds: range) -> Path:
        rows = []
        for eta, base in ((0, 0.70), (8, 0.60)):
            for seed in seeds:
                rid = f"e{eta}s{seed}"
                rows += [(rid, "FINISHED", experiment(eta, "naive"), "", "grpo", seed, "eval/pass1", s, x)
                         for s, x in ((0, 0.4), (40, base + seed / 100))]
        _table(tmp_path / name, rows)
        return tmp_path / name

    first, second = table("first.csv.gz", range(0, 3)), table("second.csv.gz", range(3, 5))
    out = tmp_path / "page" / "README.md"
    assert main(["staleness", "--runs", str(first), "--runs", str(second), "--out", str(out)]) == 0
    page = out.read_text()
    assert "| naive | grpo | 72.0 (5) | - (0) | - (0) | 62.0 (5) |" in page  # 70 + (0 + 1 + 2 + 3 + 4) / 5
    assert "| naive | grpo | 8 | 5 | -10.0 |" in page
    assert set(read_frame(out.parent / "runs.csv.gz")["run_id"]) == {f"e{e}s{s}" for e in (0, 8) for s in range(5)}
    capsys.readouterr()
    again = tmp_path / "again" / "README.md"
    assert main(["staleness", "--runs", str(first), "--runs", str(out.parent / "runs.csv.gz"),
                 "--out", str(again)]) == 2
    text = one_line(capsys)
    assert "seed 0 of experiment 'staleness-e0-naive' is in both" in text and "from one table" in text
    assert not again.parent.exists()


def test_a_table_without_the_grid_or_a_bad_margin_is_one_line_exit_2(tmp_path, capsys):
    table = tmp_path / "other.csv.gz"
    _table(table, [("r1", "FINISHED", "my-exp", "", "grpo", 0, "eval/pass1", -1, 0.5)])
    out = tmp_path / "page" / "README.md"
    assert main(["staleness", "--runs", str(table), "--out", str(out)]) == 2
    text = one_line(capsys)
    assert "holds none of the experiments" in text and "staleness-e4-tis" in text and "it holds my-exp" in text
    assert not out.parent.exists()
    assert main(["staleness", "--runs", str(table), "--margin", "0", "--out", str(out)]) == 2
    assert "--margin must be > 0" in one_line(capsys)


def test_the_grid_is_the_one_the_campaign_ran():
    assert ETAS == (0, 2, 4, 8) and list(CORRECTIONS) == ["naive", "tis", "m2po", "is"]
    assert CORRECTIONS["m2po"].algos == ("grpo", "cispo")  # M2PO masks single tokens: not gspo's sequence ratio
    assert command(4, "tis", "0") == (
        "python -m gspo_bench run --algos grpo,gspo,cispo --experiment staleness-e4-tis --set rollout.staleness=4 "
        "--set rollout.old_logp_source=recompute --set rollout.correction=tis --set rollout.correction_level=token "
        "--seed 0")
    assert len(cells()) == 16
