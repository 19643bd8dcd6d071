"""The report on the synthetic store of test_leaderboard.py: report.md, PNGs, the kind=report MLflow run."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pytest
from mlflow_fakes import one_line

from gspo_bench.cli.main import main
from gspo_bench.reporting.leaderboard import collect, load_runs
from gspo_bench.reporting.report import clip_claim, write_report
from test_leaderboard import EXP, build_store

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The store, its leaderboard before any report, and one report written through the CLI."""
    root = tmp_path_factory.mktemp("report")
    uri = build_store(root)
    before = collect(uri, EXP)
    out = root / "out"
    code = main(["report", "--tracking-uri", uri, "--experiment", EXP, "--out", str(out)])
    return uri, before, out, code


def test_report_md_states_command_commit_machine_config_and_leaderboard(made):
    uri, _, out, code = made
    assert code == 0
    md = (out / "report.md").read_text()
    assert f"python -m gspo_bench report --tracking-uri {uri} --experiment {EXP} --out {out}" in md
    assert "`abc1234`" in md and "`test box`" in md and "generated: " in md
    assert "| RL steps | 20 |" in md and "| prompts per step | 4 |" in md and "| group size | 2 |" in md
    assert "| task | model | preset | config | algo |" in md and "0.605 ± 0.134" in md
    assert "1 FAILED" in md and "1 RUNNING" in md


def test_figures_exist_and_missing_data_is_skipped_with_a_sentence(made):
    _, _, out, _ = made
    names = {p.name for p in out.glob("*.png")}
    assert names == {"eval_arith_tiny-dense.png", "clip_arith_tiny-dense.png", "ratios_arith_tiny-dense.png",
                     "moe_arith_tiny-dense.png", "paired_arith_tiny-dense.png", "eval_arith_tiny-dense_tuned.png",
                     "clip_arith_tiny-dense_tuned.png"}
    for p in out.glob("*.png"):
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, p
    md = (out / "report.md").read_text()
    tuned = md[md.index("## arith / tiny-dense / tuned"):]
    assert "(c) Token vs sequence ratios\n\nSkipped" in tuned and "(d) MoE expert flip rate\n\nSkipped" in tuned
    for name in names:
        assert f"]({name})" in md


def test_clip_ratio_and_collapse_table(made):
    _, _, out, _ = made
    md = (out / "report.md").read_text()
    default = md[md.index("## arith / tiny-dense\n"):md.index("## arith / tiny-dense / tuned")]
    # gspo: mean clip/frac 0.4; grpo: (0.015 + 0.02) / 2 = 0.0175; ratio 22.9x
    assert "GSPO 40.0 %, GRPO 1.75 %, ratio 22.9x" in default and "~15 % vs ~0.13 %" in default
    assert "| gspo | 0 | reward_drop | 15 | 0.1 | 0.2 | running mean 0.100 vs best 0.500 |" in default
    assert "step 20 (the last logged)" in default  # figure (c) uses the last ratios artifact
    tuned = md[md.index("## arith / tiny-dense / tuned"):]
    assert "### (e) Collapse events\n\nnone" in tuned
    assert "Not measured here" in clip_claim([{"algo": "gspo", "status": "FINISHED", "clip_frac": 0.4}])


def test_report_run_in_mlflow_has_the_files_and_leaderboard_ignores_it(made):
    uri, before, out, _ = made
    client = mlflow.MlflowClient(uri)
    exp_id = client.get_experiment_by_name(EXP).experiment_id
    (run,) = client.search_runs([exp_id], filter_string="tags.kind = 'report'")
    assert run.info.run_name == "report" and run.info.status == "FINISHED"
    logged = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert logged == {"report.md", *(p.name for p in out.glob("*.png"))}
    assert collect(uri, EXP) == before
    assert all(r.tags.get("kind") != "report" for r in load_runs(uri, EXP))


def test_write_report_without_mlflow_and_filters(made, tmp_path):
    uri, *_ = made
    rep = write_report(uri, EXP, tmp_path / "r", model="tiny-dense", log_to_mlflow=False)
    assert rep.run_id is None and rep.path.is_file() and len(rep.figures) == 7
    assert main(["report", "--tracking-uri", uri, "--experiment", EXP, "--model", "nope",
                 "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_an_unwritable_out_folder_is_one_line_exit_2(made, tmp_path, capsys):
    uri, *_ = made
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for out, needle in ((blocker / "sub", "--out"), (Path("/proc/sys/gspo"), "--out '/proc/sys/gspo'")):
        assert main(["report", "--tracking-uri", uri, "--experiment", EXP, "--out", str(out)]) == 2
        text = one_line(capsys)
        assert needle in text and "error" in text


def test_paired_section_per_group(made, tmp_path):
    uri, _, out, _ = made
    md = (out / "report.md").read_text()
    default = md[md.index("## arith / tiny-dense\n"):md.index("## arith / tiny-dense / tuned")]
    assert "### (f) Paired differences vs grpo" in default
    assert "| gspo | grpo | final pass@1 (points) | 2 | +5.5 | [-51.7, +62.7] | no | 0.437 | 0.437 | 73.5 |" in default
    assert "MDE (final pass@1, 2 seeds, α 0.05, 80 % power): 73.5 points" in default
    assert "](paired_arith_tiny-dense.png)" in default
    tuned = md[md.index("## arith / tiny-dense / tuned"):]
    assert "### (f) Paired differences vs grpo" in tuned and "No pairs: only grpo in this group" in tuned
    rep = write_report(uri, EXP, tmp_path / "g", baseline="gspo", strict_baseline=True, log_to_mlflow=False)
    assert "| grpo | gspo | final pass@1 (points) | 2 | -5.5 |" in rep.path.read_text()


def test_the_runs_table_remakes_leaderboard_and_report_without_the_store(made, tmp_path, capsys):
    from gspo_bench.reporting.frame import read_frame, runs_of
    from gspo_bench.reporting.report import REPORT_METRICS

    uri, _, out, _ = made
    table = out / "runs.csv.gz"
    frame = read_frame(table)
    # every run of the store (but the report's own), its status, tags and the histories the report read
    stored = {r.run_id: r for r in load_runs(uri, EXP, metrics=REPORT_METRICS)}
    assert {r.run_id for r in runs_of(frame)} == set(stored)
    for r in runs_of(frame):
        s = stored[r.run_id]
        assert (r.status, r.tags, r.history, r.metrics) == (s.status, s.tags, s.history, s.metrics)
    capsys.readouterr()
    for fmt in ("md", "csv"):
        assert main(["leaderboard", "--tracking-uri", uri, "--experiment", EXP, "--format", fmt]) == 0
        from_store = capsys.readouterr().out
        assert main(["leaderboard", "--runs", str(table), "--format", fmt]) == 0
        assert capsys.readouterr().out == from_store and from_store.count("\n") > 5
    again = tmp_path / "again"
    assert main(["report", "--runs", str(table), "--out", str(again)]) == 0
    assert "nothing logged to MLflow" in capsys.readouterr().out

    def tables(md: str) -> list[str]:  # the leaderboard and the paired tables (collapse details are artifacts)
        board = md[md.index("## Leaderboard"):md.index("## arith / tiny-dense\n")]
        return board.splitlines() + [ln for ln in md.splitlines() if "(points) |" in ln or "(steps) |" in ln]

    made_md, again_md = (out / "report.md").read_text(), (again / "report.md").read_text()
    assert f"- runs table: `{table}`" in again_md
    assert "Skipped: read from a runs table, which holds metrics, not the runs' artifacts" in again_md
    assert tables(again_md) == tables(made_md) and len(tables(made_md)) > 10
    assert (again / "eval_arith_tiny-dense.png").is_file() and not (again / "runs.csv.gz").samefile(table)


def test_runs_tables_split_by_run_join_back_to_the_same_pages(made, tmp_path, capsys):
    """``--runs A --runs B`` over an experiment's runs split in two tables reads as the one table: the same
    leaderboard, and a report whose raw data holds every run; a run in both tables is one line and exit 2."""
    from gspo_bench.reporting.frame import read_frame, write_frame

    _, _, out, _ = made
    table = out / "runs.csv.gz"
    frame = read_frame(table)
    ids = sorted(frame["run_id"].unique())
    half = set(ids[: len(ids) // 2])
    a, b = tmp_path / "a.csv.gz", tmp_path / "b.csv.gz"
    write_frame(frame[frame["run_id"].isin(half)], a)
    write_frame(frame[~frame["run_id"].isin(half)], b)
    capsys.readouterr()
    assert main(["leaderboard", "--runs", str(table), "--format", "csv"]) == 0
    whole = capsys.readouterr().out
    assert main(["leaderboard", "--runs", str(a), "--runs", str(b), "--format", "csv"]) == 0
    assert capsys.readouterr().out == whole and whole.count("\n") > 5
    joined = tmp_path / "joined"
    assert main(["report", "--runs", str(a), "--runs", str(b), "--out", str(joined)]) == 0
    assert f"- runs tables: `{a}`, `{b}`" in (joined / "report.md").read_text()
    assert sorted(read_frame(joined / "runs.csv.gz")["run_id"].unique()) == ids
    capsys.readouterr()
    assert main(["leaderboard", "--runs", str(a), "--runs", str(table)]) == 2
    text = one_line(capsys)
    assert "is in both" in text and str(a) in text and str(table) in text


def test_a_runs_file_that_is_not_one_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "runs.csv.gz"
    bad.write_bytes(b"not gzip at all")
    assert main(["leaderboard", "--runs", str(bad)]) == 2
    assert "not a runs table" in one_line(capsys)
    assert main(["leaderboard", "--runs", str(tmp_path / "none.csv.gz")]) == 2
    assert "no such file" in one_line(capsys)


RUNS_HEADER = "run_id,status,experiment,artifact_uri,tags.algo,tags.note,tags.seed,metric,step,value\n"
GOOD_ROWS = ('r1,FINISHED,arith-default,,grpo,,0,eval/pass1,-1,0.5\n'
             'r1,FINISHED,arith-default,,grpo,"two\nlines",0,eval/pass1,0,0.4\n'  # a quoted field over two lines
             'r2,RUNNING,arith-default,,gspo,,1,,,\n')  # a run that logged no metric: no step, no value


def _runs_table(path: Path, extra: str = "") -> Path:
    import gzip

    path.write_bytes(gzip.compress((RUNS_HEADER + GOOD_ROWS + extra).encode()))
    return path


@pytest.mark.parametrize("row, needle", [
    ("r3,FINISHED,arith-default,,grpo,,0,eval/pass1,-1,abc\n", "line 6: value 'abc' is not a number"),
    ("r3,FINISHED,arith-default,,grpo,,0,eval/pass1,x,0.5\n", "line 6: step 'x' is not an integer"),
    ("r3,FINISHED,arith-default,,grpo,,0,eval/pass1,1.5,0.5\n", "line 6: step '1.5' is not an integer"),
    ("r3,FINISHED,arith-default,,grpo,,0,eval/pass1,,0.5\n", "line 6: step is empty in a metric's row"),
    ("r3,DONE,arith-default,,grpo,,0,eval/pass1,-1,0.5\n", "line 6: status 'DONE' is not one of FAILED, FINISHED"),
    (",FINISHED,arith-default,,grpo,,0,eval/pass1,-1,0.5\n", "line 6: run_id is empty"),
    ("r3,FINISHED,,,grpo,,0,eval/pass1,-1,0.5\n", "line 6: experiment is empty"),
    ("r3,FINISHED,arith-default,,grpo,,0,,3,\n", "line 6: step '3' in a row without a metric"),
    ("r3,FINISHED,arith-default,,grpo,,0,eval/pass1,-1,inf\n", "line 6: value 'inf' of eval/pass1 is not finite"),
    ("r3,FINISHED,arith-default,,grpo,,0,eval/pass1,-1,1e999\n", "line 6: value '1e999' of eval/pass1 is not finite"),
    ("r3,FINISHED,arith-default,,grpo,,0,eval/pass1,-1,nan\n", "line 6: value 'nan' of eval/pass1 is not finite"),
    ("r3,FINISHED,arith-default,,grpo,,0,eval/pass1,-1,1e308\n",
     "line 6: value '1e308' of eval/pass1 is outside its range [0, 1]"),
    ("r3,FINISHED,arith-default,,grpo,,0,eval/pass_at_4,-1,-5\n",
     "line 6: value '-5' of eval/pass_at_4 is outside its range [0, 1]"),
    ("r3,FINISHED,arith-default,,grpo,,0,time/wall_s,-1,-3\n", "line 6: value '-3' of time/wall_s is below 0"),
    ("r3,FINISHED,arith-default,,grpo,,abc,eval/pass1,-1,0.5\n", "line 6: tags.seed 'abc' is not an integer"),
    ("r3,FINISHED,arith-default,,grpo,,,eval/pass1,-1,0.5\n", "line 6: tags.seed is empty"),
    ("r3,FINISHED,arith-default,,,,0,eval/pass1,-1,0.5\n", "line 6: tags.algo is empty"),
    ("r1,FINISHED,arith-default,,grpo,,0,eval/pass1,-1,0.5\n",
     "line 6: run_id 'r1', metric 'eval/pass1', step '-1' repeats line 2"),
    ("r1,FINISHED,arith-default,,grpo,,0,eval/pass1,0.0,0.3\n",
     "line 6: run_id 'r1', metric 'eval/pass1', step '0.0' repeats line 3"),  # the same step, another value
    ("r2,RUNNING,arith-default,,gspo,,1,,,\n", "line 6: run_id 'r2' has a second row without a metric, after line 5"),
], ids=["value", "step", "fractional-step", "no-step", "status", "no-run_id", "no-experiment", "step-without-metric",
        "inf", "overflow", "nan", "1e308", "negative-pass-at-k", "negative-time", "seed", "no-seed", "no-algo",
        "repeated-row", "repeated-step", "repeated-empty-run"])
@pytest.mark.parametrize("cmd", ["leaderboard", "report", "claims"])
def test_a_bad_row_of_a_runs_table_is_named_by_its_line_one_line_exit_2(cmd, row, needle, tmp_path, capsys):
    table = _runs_table(tmp_path / "runs.csv.gz", row)
    out = tmp_path / "out"
    extra = {"leaderboard": [], "report": ["--out", str(out)], "claims": ["--out", str(out / "claims.md")]}[cmd]
    assert main([cmd, "--runs", str(table), *extra]) == 2
    text = one_line(capsys)
    assert text.startswith("gspo-bench: error: --runs ") and str(table) in text and needle in text, text
    assert not out.exists()  # refused before any work


def test_a_start_time_that_is_no_number_is_named_by_its_line(tmp_path, capsys):
    import gzip

    table = tmp_path / "runs.csv.gz"
    table.write_bytes(gzip.compress(b"run_id,status,experiment,artifact_uri,start_time,tags.algo,tags.seed,metric,step,"
                                    b"value\n"
                                    b"r1,FINISHED,e,,1700000000000,grpo,0,eval/pass1,-1,0.5\n"
                                    b"r2,FINISHED,e,,soon,grpo,1,eval/pass1,-1,0.5\n"))
    assert main(["leaderboard", "--runs", str(table)]) == 2
    assert "line 3: start_time 'soon' is not a number" in one_line(capsys)


def test_a_well_typed_runs_table_reads_back(tmp_path):
    import math

    from gspo_bench.reporting.frame import read_frame, runs_of

    r1, r2 = runs_of(read_frame(_runs_table(tmp_path / "runs.csv.gz",
                                             "r1,FINISHED,arith-default,,grpo,,0,eval/pass1,1.0,\n")))
    assert (r1.status, r1.metrics, r1.history["eval/pass1"][0]) == ("FINISHED", {"eval/pass1": 0.5}, (0, 0.4))
    assert r1.history["eval/pass1"][1][0] == 1 and math.isnan(r1.history["eval/pass1"][1][1])  # empty value: NaN
    assert (r2.run_id, r2.status, r2.metrics, r2.history) == ("r2", "RUNNING", {}, {})


ARITH_TABLE = Path(__file__).parent.parent / "results" / "arith-default" / "runs.csv.gz"


@pytest.fixture(scope="module")
def arith_part():
    """The committed arith-default table cut to grpo and gspo, seeds 0 and 1: a real table small enough to
    read three times per case."""
    from gspo_bench.reporting.frame import read_frame

    frame = read_frame(ARITH_TABLE)
    keep = frame["tags.algo"].isin(["grpo", "gspo"]) & frame["tags.seed"].isin(["0", "1"])
    return frame[keep].reset_index(drop=True)


def _spoiled(frame, how: str):
    """``frame`` spoiled as a hostile table would be, and the row (0-based) the refusal must name."""
    import pandas as pd

    frame = frame.copy()
    first = int((frame["metric"] == "eval/pass1").to_numpy().argmax())
    if how == "doubled":  # every row twice: the completions/s of every run counted twice
        return pd.concat([frame, frame], ignore_index=True), len(frame)
    column, value = {"inf": ("value", "inf"), "1e308": ("value", "1e308"), "-5": ("value", "-5"),
                     "seed": ("tags.seed", "abc"), "algo": ("tags.algo", "")}[how]
    frame.loc[first, column] = value
    return frame, first


@pytest.mark.parametrize("how, needle", [
    ("doubled", "repeats line 2 (a run has one value per metric and step"),
    ("inf", "value 'inf' of eval/pass1 is not finite"),
    ("1e308", "value '1e308' of eval/pass1 is outside its range [0, 1]"),
    ("-5", "value '-5' of eval/pass1 is outside its range [0, 1]"),
    ("seed", "tags.seed 'abc' is not an integer"),
    ("algo", "tags.algo is empty"),
])
def test_a_spoiled_results_table_is_one_line_exit_2_before_any_command_writes(arith_part, how, needle, tmp_path,
                                                                                capsys):
    from gspo_bench.reporting.frame import write_frame

    frame, row = _spoiled(arith_part, how)
    table = write_frame(frame, tmp_path / "runs.csv.gz")
    out = tmp_path / "out"
    capsys.readouterr()
    for cmd, extra in (("leaderboard", []), ("report", ["--out", str(out)]),
                       ("claims", ["--out", str(out / "claims.md")])):
        assert main([cmd, "--runs", str(table), *extra]) == 2, cmd
        text = one_line(capsys)
        assert text.startswith(f"gspo-bench: error: --runs {str(table)!r}: line {row + 2}: "), (cmd, text)
        assert needle in text, (cmd, text)
        assert not out.exists(), cmd  # no page, figure or table written


def test_an_infinite_value_is_written_as_the_largest_float_and_reads_back(tmp_path):
    import math
    import sys

    import pandas as pd

    from gspo_bench.reporting.frame import read_frame, runs_of, write_frame

    frame = pd.DataFrame({"run_id": ["r1", "r1"], "status": "FINISHED", "experiment": "e", "artifact_uri": "",
                          "tags.algo": "grpo", "tags.seed": "0", "metric": "train/loss", "step": [-1, 3],
                          "value": [math.inf, -math.inf]})
    [run] = runs_of(read_frame(write_frame(frame, tmp_path / "runs.csv.gz")))
    big = sys.float_info.max  # what MLflow's SQL stores keep for an infinite value
    assert run.metrics == {"train/loss": big} and run.history == {"train/loss": [(3, -big)]}


@pytest.mark.parametrize("ro", ["store-folder", "folder-only"])
def test_a_read_only_store_is_one_line_exit_2_before_the_report_writes_anything(made, ro, tmp_path):
    """A report logs its own run: against a store it cannot write it used to write its whole folder, then fail
    with SQLAlchemy tracebacks and exit 1. "store-folder": the database's folder mounted read only;
    "folder-only": the file itself writable in that read-only folder (SQLite writes a journal beside it)."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to mount a read-only folder, as root or not")
    uri, *_ = made
    db = Path(uri[len("sqlite:///"):])
    copy, mnt, out = tmp_path / "m.db", tmp_path / "ro", tmp_path / "out"
    shutil.copy(db, copy)  # "folder-only" mounts it, writable, over the read-only folder's file
    mnt.mkdir()
    mounts = f"mount --bind -o ro {db.parent} {mnt}" + (f" && mount --bind {copy} {mnt / 'm.db'}"
                                                         if ro == "folder-only" else "")
    inner = (f"{sys.executable} -m gspo_bench report --tracking-uri sqlite:///{mnt}/m.db --experiment {EXP} "
             f"--out {out}")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("MLFLOW_TRACKING_URI", None)
    # a user and mount namespace of its own: a read-only bind mount, as root or not
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", f"{mounts} && cd {tmp_path} && {inner}"], env=env,
                          capture_output=True, text=True, timeout=300)
    text = (proc.stdout + proc.stderr).strip()
    refused = mnt / "m.db" if ro == "store-folder" else mnt
    assert proc.returncode == 2, text
    assert text.splitlines() == [f"gspo-bench: error: tracking URI 'sqlite:///{mnt}/m.db': cannot write "
                                 f"{str(refused)!r} (Read-only file system); report logs its own run there "
                                 "(kind=report)"]
    assert not out.exists()


def test_every_runs_table_in_results_reads(capsys):
    from gspo_bench.reporting.frame import read_frame

    tables = sorted((Path(__file__).parent.parent / "results").rglob("runs.csv.gz"))
    assert tables
    for table in tables:
        assert len(read_frame(table)) > 0, table


def test_a_missing_optuna_storage_file_stops_the_report_before_its_folder_is_made(made, tmp_path, capsys):
    _, _, made_out, _ = made
    out = tmp_path / "report"
    missing = tmp_path / "missing.db"
    capsys.readouterr()
    code = main(["report", "--runs", str(made_out / "runs.csv.gz"), "--storage", f"sqlite:///{missing}",
                 "--out", str(out)])
    text = one_line(capsys)
    assert code == 2 and f"no database file {str(missing)!r}" in text, text
    assert not out.exists() and not missing.exists()


def test_the_collapse_table_keeps_the_detectors_values_or_says_where_they_are():
    from gspo_bench.reporting.frame import RunData
    from gspo_bench.reporting.report import collapse_table

    def run(algo: str, seed: str) -> RunData:
        return RunData(run_id=f"{algo}{seed}", status="FINISHED", tags={"algo": algo, "seed": seed}, params={},
                       metrics={})

    assert collapse_table([]) == ["none", ""]
    full = collapse_table([(run("grpo", "1"), {"kind": "eval_drop", "step": 20, "value": 0.1234567, "threshold": 0.2,
                                               "detail": "eval pass@1 0.123 vs best 0.400"}),
                           (run("grpo", "0"), {"kind": "reward_drop", "step": 7, "value": 0.05})])
    rows = [ln for ln in full[0].splitlines() if ln.startswith("| grpo")]
    assert rows == ["| grpo | 0 | reward_drop | 7 | 0.05 | - | - |",
                    "| grpo | 1 | eval_drop | 20 | 0.1235 | 0.2 | eval pass@1 0.123 vs best 0.400 |"]
    # from a runs table: kinds and steps only, no column of dashes, and the note naming the artifact
    bare = collapse_table([(run("cispo", "2"), {"kind": "eval_drop", "step": 10}),
                           (run("cispo", "0"), {"kind": "ratio_explosion", "step": 1})])
    assert bare[0].splitlines()[0] == "| algo | seed | kind | step |"
    assert [ln for ln in bare[0].splitlines() if ln.startswith("| cispo")] == [
        "| cispo | 0 | ratio_explosion | 1 |", "| cispo | 2 | eval_drop | 10 |"]
    assert "`collapse_events.json` artifact" in bare[2]
