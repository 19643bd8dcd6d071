"""`suite`: the cross-scenario ranking (pure), and the command end to end on the smoke preset with tiny settings:
every cell FINISHED, outputs written, resume skips done cells and re-runs only removed or FAILED ones, dry run,
bad input."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest

from gspo_bench.cli.main import main
from gspo_bench.reporting.suite_summary import rank_scenario, rank_suite
from gspo_bench.suite.run import SCENARIOS, SuiteRequest, scenario_config
from gspo_bench.suite.cost import ALGO_COST, cell_seconds

ALGOS = ("grpo", "gspo")
SEEDS = ("0", "1")
EXP = "suite-smoke"


# -- the ranking, on hand-made numbers --------------------------------------------------------------------------
def test_rank_scenario_orders_by_mean_and_ties_share_the_average_place():
    r = rank_scenario({"a": {"0": 0.5, "1": 0.75}, "b": {"0": 0.875, "1": 0.875}, "c": {"0": 0.625, "1": 0.625},
                       "d": {"0": 0.25, "1": 1.0}, "e": {}})
    assert r["means"]["a"] == 0.625 and r["means"]["e"] is None
    # b first; a, c, d all 0.625 share places 2-4; e has no finished seed: unranked
    assert r["ranks"] == {"b": 1.0, "a": 3.0, "c": 3.0, "d": 3.0, "e": None}
    assert r["order"][0] == "b" and "e" not in r["order"] and r["n"] == {"a": 2, "b": 2, "c": 2, "d": 2, "e": 0}


def test_significantly_best_and_worst_are_paired_intervals_against_the_neighbour():
    finals = {"top": {"0": 0.80, "1": 0.82, "2": 0.81},   # +0.20, +0.19, +0.20 over mid: interval well above 0
              "mid": {"0": 0.60, "1": 0.63, "2": 0.61},
              "low": {"0": 0.50, "1": 0.70, "2": 0.58}}   # -0.10, +0.07, -0.03 vs mid: interval spans 0
    r = rank_scenario(finals)
    assert r["order"] == ["top", "mid", "low"]
    best, worst = r["best"], r["worst"]
    assert (best["algo"], best["vs"], best["n"]) == ("top", "mid", 3)
    assert best["mean_diff"] == pytest.approx((0.20 + 0.19 + 0.20) / 3)
    assert best["ci"][0] > 0 and best["significant"]
    assert (worst["algo"], worst["vs"]) == ("low", "mid")
    assert worst["ci"][0] < 0 < worst["ci"][1] and not worst["significant"]
    # a consistently worse bottom algorithm is significantly worst
    finals["low"] = {"0": 0.50, "1": 0.52, "2": 0.52}
    assert rank_scenario(finals)["worst"]["significant"]


def test_best_and_worst_are_one_family_holm_decides():
    from scipy.stats import ttest_1samp

    # top - mid: +0.10, +0.05, +0.12: its own interval lies above 0 (p about 0.04), but both tests are one family;
    # low - mid is far from decided, so Holm doubles the smaller p and the top is not significantly best
    finals = {"top": {"0": 0.70, "1": 0.68, "2": 0.73}, "mid": {"0": 0.60, "1": 0.63, "2": 0.61},
              "low": {"0": 0.50, "1": 0.70, "2": 0.58}}
    r = rank_scenario(finals)
    p_best = ttest_1samp([0.10, 0.05, 0.12], 0.0).pvalue
    p_worst = ttest_1samp([-0.10, 0.07, -0.03], 0.0).pvalue
    assert r["best"]["p"] == pytest.approx(p_best) and p_best < 0.05 and r["best"]["ci"][0] > 0
    assert r["best"]["p_holm"] == pytest.approx(min(1.0, 2 * p_best)) and r["best"]["p_holm"] > 0.05
    assert r["worst"]["p_holm"] == pytest.approx(max(2 * p_best, p_worst))
    assert not r["best"]["significant"] and not r["worst"]["significant"]
    # two ranked algorithms: best and worst are one test, nothing adjusted
    two = rank_scenario({a: finals[a] for a in ("top", "mid")})
    assert two["best"]["p_holm"] == pytest.approx(p_best) and two["best"]["significant"]
    assert two["worst"]["p_holm"] == pytest.approx(p_best) and two["worst"]["significant"]  # the same test


def test_pairs_use_only_common_seeds_and_one_pair_is_never_significant():
    r = rank_scenario({"a": {"0": 0.9, "1": 0.9}, "b": {"0": 0.1}})
    assert r["best"]["n"] == 1 and r["best"]["ci"] is None and not r["best"]["significant"]
    assert r["best"]["seeds"] == ["0"]
    # tied at the top: difference 0, never significant, even with a zero-width interval
    tie = rank_scenario({"a": {"0": 0.5, "1": 0.6}, "b": {"0": 0.5, "1": 0.6}})
    assert tie["ranks"] == {"a": 1.5, "b": 1.5} and not tie["best"]["significant"]
    assert rank_scenario({"a": {"0": 0.5}, "b": {}})["best"] is None  # one ranked algorithm: no test


def test_rank_suite_mean_rank_significance_counts_and_collapses():
    up = {"0": 0.8, "1": 0.81, "2": 0.8}
    down = {"0": 0.4, "1": 0.42, "2": 0.41}
    per = {"s1": {"x": up, "y": down, "z": {"0": 0.6, "1": 0.62, "2": 0.61}},
           "s2": {"x": down, "y": up, "z": {}},  # z has no finished seed in s2
           "s3": {"x": up, "y": {"0": 0.5, "1": 0.9, "2": 0.1}, "z": {"0": 0.5, "1": 0.1, "2": 0.9}}}
    res = rank_suite(per, {"x": 1, "y": 0, "z": 3})
    rows = {r["algo"]: r for r in res["algorithms"]}
    assert rows["x"]["ranks"] == {"s1": 1.0, "s2": 2.0, "s3": 1.0} and rows["x"]["mean_rank"] == pytest.approx(4 / 3)
    assert rows["z"]["ranks"]["s2"] is None and rows["z"]["ranked_in"] == 2
    assert rows["z"]["mean_rank"] == pytest.approx((2 + 2.5) / 2)  # y and z tie at 0.5 in s3
    # s1: x clearly above z, y clearly below z; s2: y clearly above x; s3: x first, y and z tied behind it
    assert res["scenarios"]["s1"]["best"]["significant"] and res["scenarios"]["s1"]["worst"]["significant"]
    assert not res["scenarios"]["s3"]["best"]["significant"]  # x - y = +0.3, -0.1, +0.7: interval spans 0
    assert (rows["x"]["significantly_best"], rows["y"]["significantly_best"]) == (1, 1)
    assert (rows["x"]["significantly_worst"], rows["y"]["significantly_worst"]) == (1, 1)  # s2: x; s1: y
    assert [r["algo"] for r in res["algorithms"]] == ["x", "y", "z"]  # by mean rank
    assert (rows["x"]["collapse_events"], rows["z"]["collapse_events"]) == (1, 3)


def test_cost_model_grows_with_the_work_and_the_default_scenarios_are_named():
    assert SCENARIOS == ("long", "offpolicy", "stale", "moe-bf16", "hot", "entropy")
    small = scenario_config("smoke", SuiteRequest(sets=("train.steps=2",)), ["grpo"])
    big = scenario_config("smoke", SuiteRequest(sets=("train.steps=20",)), ["grpo"])
    assert small.tracking.experiment == "suite-smoke" and small.train.progress is False
    assert cell_seconds(big, "grpo") > cell_seconds(small, "grpo") > 0
    assert cell_seconds(small, "ppo") > cell_seconds(small, "grpo")


def test_warm_start_key_is_the_runs_own_and_a_dry_run_with_warm_starts_plans(tmp_path, monkeypatch, capsys):
    from gspo_bench.suite.cost import warmstart_key
    from gspo_bench.tasks import load_task
    from gspo_bench.train.warmstart import cache_key

    monkeypatch.chdir(tmp_path)
    cfg = scenario_config("stale", SuiteRequest(), ["grpo"])
    assert cfg.warmstart.enabled
    # the key the run itself uses: the task loaded and rendered for the model's tokenizer
    task = load_task(cfg.task, 0, model=cfg.model, options=cfg.task_options, log=lambda *_: None)
    assert warmstart_key(cfg, 0) == cache_key(task, cfg.model, cfg.warmstart, 0)
    argv = ["suite", "--scenarios", "stale,hot", "--algos", "grpo,sapo", "--seeds", "2", "--dry-run",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "8 cells: 0 already done, 8 to run" in text and "warm start" in text
    assert not (tmp_path / "mlflow.db").exists()
    # a multi-turn scenario: the key carries how its episodes are played, as the run's own does
    tools = scenario_config("tools", SuiteRequest(), ["grpo"])
    task = load_task(tools.task, 3, model=tools.model, options=tools.task_options, log=lambda *_: None)
    assert warmstart_key(tools, 3) == cache_key(task, tools.model, tools.warmstart, 3, tools.env)
    assert warmstart_key(tools, 3) != cache_key(task, tools.model, tools.warmstart, 3)  # env.max_tool_tokens=16


def test_a_model_that_is_never_warm_started_is_charged_no_warm_start(tmp_path, monkeypatch):
    from gspo_bench.suite.run import make_plan

    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))  # nothing cached: a warm start would be built
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    charged = {model: make_plan(SuiteRequest(scenarios=("stale",), algos=("grpo",), seeds=[0], tracking_uri=tracking,
                                             sets=(f"model.name={model}",))).scenarios[0].warmstart_s
               for model in ("tiny-dense", "qwen3-0.6b-arch")}
    assert charged["tiny-dense"][0] > 0 and charged["qwen3-0.6b-arch"] == {0: 0.0}


# -- the command, end to end -------------------------------------------------------------------------------------
def _argv(root: Path, task: str, *extra: str, progress: bool = False) -> list[str]:
    sets = ["warmstart.enabled=false", "rollout.prompts_per_step=4", "rollout.group_size=4", "train.steps=2",
            "train.eval_prompts=8", "train.eval_every=1", "train.eval_samples=2", "train.minibatches=2",
            "train.lr=0.001", f"task={task}"]
    return ["suite", "--scenarios", "smoke", "--algos", ",".join(ALGOS), "--seeds", "2",
            *([] if progress else ["--no-progress"]), "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--out", str(root / "out"),
            *[x for s in sets for x in ("--set", s)], *extra]


def _cell_runs(uri: str) -> list:
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(EXP)
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("kind") != "report"]


def _all_runs(uri: str) -> list:
    client = mlflow.MlflowClient(uri)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


@pytest.fixture(scope="module")
def suite(tmp_path_factory, mixed_task):
    """One suite: smoke x (grpo, gspo) x seeds 0, 1 with tiny settings, in its own folder and MLflow store."""
    root = tmp_path_factory.mktemp("suite")
    s = SimpleNamespace(root=root, task=mixed_task, uri=f"sqlite:///{root / 'mlflow.db'}", out=root / "out")
    with pytest.MonkeyPatch.context() as mp:  # module scope: set what conftest's autouse fixtures would
        mp.setenv("GSPO_BENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.chdir(root)  # MLflow's ./mlruns artifacts
        s.code = main(_argv(root, mixed_task))
    return s


@pytest.fixture
def in_root(suite, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(suite.root)
    return suite


def test_every_cell_finished_in_mlflow(suite):
    assert suite.code == 0
    runs = _cell_runs(suite.uri)
    cells = {(r.data.tags["algo"], r.data.tags["seed"]) for r in runs if r.info.status == "FINISHED"}
    assert cells == {(a, s) for a in ALGOS for s in SEEDS}
    assert all(r.data.tags["preset"] == "smoke" and r.data.tags["task"] == "mixed" for r in runs)


def test_outputs_name_every_algorithm_with_consistent_ranks(suite):
    board = (suite.out / "smoke" / "leaderboard.md").read_text()
    for a in ALGOS:
        assert f"| mixed | tiny-dense | smoke | default | {a} | finished | 2 (0,1) |" in board
    assert "Paired differences vs grpo" in board and "MDE" in board
    doc0 = json.loads((suite.out / "suite.json").read_text())
    assert "Made by `python -m gspo_bench suite --scenarios smoke" in board
    assert f"at commit `{doc0['commit']}`" in board
    assert "suite-smoke" in (suite.out / "smoke" / "report.md").read_text()
    doc = json.loads((suite.out / "suite.json").read_text())
    assert (doc["cells"], doc["finished"], doc["exit_code"], doc["scenarios"]) == (4, 4, 0, ["smoke"])
    assert doc["commit"] and doc["machine"] and doc["wall_s"] > 0
    sc = doc["ranking"]["scenarios"]["smoke"]
    means, ranks = sc["means"], sc["ranks"]
    assert set(ranks) == set(ALGOS) and sorted(ranks.values()) in ([1.0, 2.0], [1.5, 1.5])
    hi, lo = sorted(ALGOS, key=lambda a: -means[a])
    assert (ranks[hi] < ranks[lo]) == (means[hi] > means[lo])
    summary = (suite.out / "summary.md").read_text()
    for row in doc["ranking"]["algorithms"]:
        a = row["algo"]
        assert f"| `{a}` | {ranks[a]:g} ({means[a]:.3f}) | {row['mean_rank']:.2f} |" in summary
    assert "What these ranks can and cannot support" in summary and "n = 2 seeds" in summary
    assert doc["commit"] in summary and "wall time of this invocation" in summary


def test_dry_run_plans_with_measured_times_and_runs_nothing(in_root, capsys):
    before = len(_all_runs(in_root.uri))
    assert main(_argv(in_root.root, in_root.task, "--seeds", "3", "--dry-run")) == 0
    text = capsys.readouterr().out
    assert "6 cells: 4 already done, 2 to run" in text and "ETA: ~" in text and "measured" in text
    assert len(_all_runs(in_root.uri)) == before


def test_an_unmeasured_algorithm_is_estimated_from_the_others_scaled_by_algo_cost(in_root):
    from gspo_bench.suite.run import plan_scenario

    argv = _argv(in_root.root, in_root.task)
    sets = tuple(argv[i + 1] for i, x in enumerate(argv) if x == "--set")
    req = SuiteRequest(scenarios=("smoke",), algos=["grpo", "gspo", "ppo"], seeds=[0, 1],
                       tracking_uri=in_root.uri, sets=sets)
    plan = plan_scenario("smoke", req, ["grpo", "gspo", "ppo"])
    walls = {a: [] for a in ALGOS}
    for r in _cell_runs(in_root.uri):
        walls[r.data.tags["algo"]].append(r.data.metrics["time/wall_s"])
    # each measured run as grpo-equivalent seconds (wall / ALGO_COST of its algorithm), averaged, x ppo's cost
    grpo_equiv = [w / ALGO_COST[a] for a, ws in walls.items() for w in ws]
    want = sum(grpo_equiv) / len(grpo_equiv) * ALGO_COST["ppo"]
    assert plan.per_cell["ppo"][0] == pytest.approx(want)
    assert "scaled by ALGO_COST" in plan.per_cell["ppo"][1]
    assert plan.per_cell["grpo"][0] == pytest.approx(sum(walls["grpo"]) / len(walls["grpo"]))
    assert [a for a, _ in plan.todo] == ["ppo", "ppo"]


def test_dry_run_on_an_empty_store_uses_the_cost_model_and_creates_nothing(tmp_path, monkeypatch, capsys,
                                                                           mixed_task):
    monkeypatch.chdir(tmp_path)
    assert main(_argv(tmp_path, mixed_task, "--dry-run")) == 0
    text = capsys.readouterr().out
    assert "4 cells: 0 already done, 4 to run" in text and "cost model" in text and "ETA: ~" in text
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "out").exists()


def test_second_invocation_runs_nothing(in_root, capsys):
    before = sorted(r.info.run_id for r in _all_runs(in_root.uri))
    assert main(_argv(in_root.root, in_root.task)) == 0
    text = capsys.readouterr().out
    assert "4 already done, 0 to run" in text and text.count("already FINISHED") == 4
    assert sorted(r.info.run_id for r in _all_runs(in_root.uri)) == before


def test_removed_or_failed_cells_and_only_those_run_again(in_root, capsys):
    client = mlflow.MlflowClient(in_root.uri)

    def finished() -> dict:
        return {(r.data.tags["algo"], r.data.tags["seed"]): r.info.run_id
                for r in _cell_runs(in_root.uri) if r.info.status == "FINISHED"}

    start = finished()
    client.delete_run(start[("gspo", "1")])
    client.set_terminated(start[("grpo", "0")], "FAILED")
    assert main(_argv(in_root.root, in_root.task)) == 0
    text = capsys.readouterr().out
    assert "2 already done, 2 to run" in text
    ran = [line for line in text.splitlines() if line.startswith("[")]
    assert [line.split(":")[0] for line in ran if "/2]" in line] == ["[1/2] smoke / grpo / seed 0",
                                                                      "[2/2] smoke / gspo / seed 1"]
    now = finished()
    assert set(now) == {(a, s) for a in ALGOS for s in SEEDS}
    assert now[("gspo", "0")] == start[("gspo", "0")] and now[("grpo", "1")] == start[("grpo", "1")]
    assert now[("gspo", "1")] != start[("gspo", "1")] and now[("grpo", "0")] != start[("grpo", "0")]
    doc = json.loads((in_root.out / "suite.json").read_text())
    assert (doc["ran"], doc["skipped"], doc["finished"]) == (2, 2, 4)


def test_a_finished_cell_with_other_settings_is_an_error(in_root, capsys):
    assert main(_argv(in_root.root, in_root.task, "--set", "train.steps=3", "--dry-run")) == 2
    text = capsys.readouterr().out.strip()
    assert "train.steps: 2 != 3" in text and "--experiment-prefix" in text and len(text.splitlines()) == 1


def test_failing_cells_do_not_stop_the_suite_and_exit_1(tmp_path, monkeypatch, capsys, mixed_task):
    import gspo_bench.train.runner

    calls = []

    def boom(cfg, log=print, resume=False):
        assert resume  # a stopped cell continues from its checkpoint
        calls.append((cfg.algos, cfg.seeds))
        raise RuntimeError("no luck")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gspo_bench.train.runner, "run", boom)
    assert main(_argv(tmp_path, mixed_task, progress=True)) == 1  # with the bar over cells
    assert calls == [(["grpo"], [0]), (["gspo"], [0]), (["grpo"], [1]), (["gspo"], [1])]
    text = capsys.readouterr().out
    assert text.count(": FAILED in") == 4
    doc = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert (doc["finished"], doc["exit_code"]) == (0, 1)
    assert doc["ranking"]["algorithms"][0]["mean_rank"] is None


@pytest.mark.parametrize("extra, needle", [(["--scenarios", "smoke,nope"], "'nope'"),
                                          (["--algos", "grpo,nope"], "nope"),
                                          (["--seeds", "0"], "--seeds"),
                                          (["--set", "train.nope=1"], "train.nope"),
                                          (["--scenarios", "smoke,smoke"], "--scenarios names smoke more than once"),
                                          (["--algos", "grpo,gspo,grpo"], "--algos names grpo more than once"),
                                          (["--seed", "0,1,0,1"], "--seed names 0, 1 more than once")])
def test_bad_input_is_one_line_exit_2(extra, needle, tmp_path, monkeypatch, capsys, mixed_task):
    monkeypatch.chdir(tmp_path)
    argv = _argv(tmp_path, mixed_task)
    if "--seed" in extra:  # instead of the usual --seeds (the two exclude each other)
        at = argv.index("--seeds")
        del argv[at:at + 2]
    assert main([*argv, *extra]) == 2
    text = capsys.readouterr().out.strip()
    assert needle in text and "error" in text and len(text.splitlines()) == 1, text
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--backend", "ray", "--ray-address", "127.0.0.1:1"]],
                         ids=["local", "dry-run", "ray"])
@pytest.mark.parametrize("sets, needle", [
    (["loss.clip_cov_lb=5", "loss.clip_cov_ub=1"], "loss.clip_cov_lb=5 must be below loss.clip_cov_ub=1"),
    (["loss.clip_cov_lb=6"], "loss.clip_cov_lb=6 must be below loss.clip_cov_ub=5"),  # ub: clip_cov's own default
    (["loss.entropy_coef=5", "loss.entropy_target=0.2"], "loss.entropy_coef=5 must be within"),
    (["rollout.rejection=token_k1", "rollout.rejection_threshold=2_0.5"], "'2_0.5' for token_k1 must be 'lo_hi'"),
])
def test_rules_between_settings_are_checked_before_any_cell_on_every_backend(sets, needle, extra, tmp_path,
                                                                             monkeypatch, capsys, mixed_task):
    monkeypatch.chdir(tmp_path)
    argv = _argv(tmp_path, mixed_task, *[x for s in sets for x in ("--set", s)], *extra)
    argv[argv.index("--algos") + 1] = "grpo,clip_cov"
    assert main(argv) == 2
    text = capsys.readouterr().out.strip()
    assert needle in text and "error" in text and len(text.splitlines()) == 1, text
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_drivers_started_together_on_one_store_run_each_cell_once(tmp_path):
    import os
    import subprocess
    import sys

    # a built-in verifier: the drivers are processes of their own, without the tests' registered ones
    task = tmp_path / "exact.yaml"
    task.write_text("name: exact\nkind: arith\nverifier: exact\nmax_new_tokens: 6\n"
                    "params: {min_digits: 1, max_digits: 2, n_train: 500, n_eval: 16}\n")
    argv = _argv(tmp_path, str(task))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("MLFLOW_TRACKING_URI", None)
    procs = [subprocess.Popen([sys.executable, "-m", "gspo_bench", *argv, "--out", str(tmp_path / f"out{i}")],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(EXP)
    runs = client.search_runs([exp.experiment_id])
    cells = sorted((r.data.tags["algo"], r.data.tags["seed"]) for r in runs if r.data.tags.get("kind") is None)
    # every cell ran once between them (before, each driver ran all four: eight runs, every seed counted twice)
    assert cells == sorted((a, s) for a in ALGOS for s in SEEDS), "\n".join(o[-2000:] for o in outs)
    assert all(r.info.status == "FINISHED" for r in runs if r.data.tags.get("kind") is None)
    assert not [r for r in runs if r.data.tags.get("kind") == "claim"]  # every claim released
    ran = [line for o in outs for line in o.splitlines() if ": FINISHED in" in line]
    assert len(ran) == 4, outs
    assert any(p.returncode == 0 for p in procs)  # the last one to finish saw every cell FINISHED
