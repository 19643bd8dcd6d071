"""What a user sees in ``mlflow ui`` (``gspo_bench.tracking.ui``): every experiment gspo_bench writes to is a
"Machine learning" one (``mlflow.experimentKind``), every run carries a Markdown description
(``mlflow.note.content``), and the UI links open on the runs table."""

from __future__ import annotations

from types import SimpleNamespace

import mlflow
import pytest

from gspo_bench.config import load_config
from gspo_bench.core.losses import LOSSES
from gspo_bench.train.runner import run
from gspo_bench.tracking.ui import (EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, NOTE_TAG, mark_experiment, run_description,
                                 ui_url)
from tests.conftest import tiny_overrides


def test_a_run_marks_its_experiment_and_describes_itself(mixed_task, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    o = tiny_overrides(mixed_task, uri, tracking={"tracking_uri": uri, "experiment": "kind"},
                       rollout={"correction": "tis"})
    [result] = run(load_config("smoke", overrides={**o, "algos": ["gspo"]}), log=lambda *a, **k: None)
    assert result.status == "FINISHED", result.error

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("kind")
    assert exp.tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    r = client.get_run(result.run_id)
    assert r.info.run_name == "gspo-s0"
    note = r.data.tags[NOTE_TAG]
    assert note.startswith("**gspo**: sequence-level ratio") and "\n" not in note
    for words in ("`seq-mean` aggregation", "task `mixed`", "model `tiny-dense`", "seed 0", "preset `smoke`",
                  "2 RL steps of 4 prompts x 4 samples", "clip band [1 - 0.0003, 1 + 0.0004]",
                  "Stabilisers: TIS correction (cap 2)"):
        assert words in note, note


@pytest.mark.parametrize("algo", sorted(LOSSES))
def test_the_description_names_the_algorithm_and_its_loss(algo):
    spec = LOSSES[algo]
    text = run_description(algo, 3, "smoke", "arith", "Qwen/Qwen3-0.6B")
    assert text.startswith(f"**{algo}**: {spec.ratio}-level ratio") and f"`{spec.aggregation}`" in text
    assert spec.loss in text and "seed 3" in text and "model `Qwen/Qwen3-0.6B`" in text
    assert "Stabilisers" not in text  # nothing known about the settings: nothing claimed


def test_the_description_lists_the_stabilisers_of_the_settings():
    settings = {"tuning": "tuned", "train": {"steps": 200, "lr": 3e-6}, "moe": {"routing_replay": "r3"},
                "resolved": {"loss": {"eps_low": None, "eps_high": 5.0, "kl_coef": 0.0},
                             "rollout": {"prompts_per_step": 16, "group_size": 8, "correction": "mis",
                                         "correction_cap": 2.0, "dtype": "bfloat16", "staleness": 1},
                             "warmstart": {"pass1": 0.125}}}
    text = run_description("cispo", 0, "moe-bf16", "gsm8k", "tiny-moe", settings)
    assert "clip band (0, 1 + 5]" in text and "(tuned settings)" in text
    assert "200 RL steps of 16 prompts x 8 samples, lr 3e-06, from a warm start at greedy pass@1 12.5%" in text
    assert text.endswith("Stabilisers: MIS correction (cap 2), routing replay r3 (MoE models), bfloat16 rollouts, "
                         "staleness 1.")
    plain = {"resolved": {"rollout": {"correction": "none", "dtype": "float32", "staleness": 0,
                                      "advantage_estimator": "group"}}}
    assert run_description("grpo", 0, "smoke", "arith", "tiny-dense", plain).endswith(
        "Stabilisers: none (on-policy, float32 rollouts, no correction).")
    other = {"resolved": {"rollout": {"advantage_estimator": "rloo"}}}
    assert run_description("grpo", 0, "smoke", "arith", "tiny-dense", other).endswith(
        "Stabilisers: advantage estimator rloo.")
    assert run_description("mine", 0, "p", "t", "m").startswith("**mine**; task `t`")  # no registered loss


def test_mark_experiment_sets_the_kind_once_and_keeps_a_chosen_one(tmp_path):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    fresh, chosen = client.create_experiment("fresh"), client.create_experiment("chosen")
    client.set_experiment_tag(chosen, EXPERIMENT_KIND_TAG, "genai_development")  # the UI's kind selector
    for _ in range(2):
        mark_experiment(client, fresh)
        mark_experiment(client, chosen)
    assert client.get_experiment(fresh).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_report_and_tune_mark_the_experiments_they_write_to(tmp_path, monkeypatch):
    from gspo_bench.reporting.report import Report, log_report
    from gspo_bench.tuning import trials
    from gspo_bench.tuning.study import TuneRequest

    uri = f"sqlite:///{tmp_path}/m.db"
    client = mlflow.MlflowClient(uri)
    older = client.create_experiment("older")  # made before gspo_bench tagged its experiments
    (tmp_path / "report.md").write_text("# report\n")
    log_report(client, older, Report(tmp_path / "report.md"), "older", 0)
    assert client.get_experiment(older).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND

    # tune: prepare() makes the experiment; the task and warm start are not what is tested here
    monkeypatch.setattr("gspo_bench.tasks.load_task", lambda *a, **k: SimpleNamespace(spec=SimpleNamespace(
        max_new_tokens=4)))
    monkeypatch.setattr("gspo_bench.train.warmstart.warm_start", lambda *a, **k: SimpleNamespace(cached=False))
    cfg = load_config("smoke", overrides={"tracking": {"tracking_uri": uri, "experiment": "tuned"}})
    shared = trials.prepare(TuneRequest(algo="gspo"), cfg, uri, None, lambda *a, **k: None)
    assert client.get_experiment(shared.exp_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND


def test_ui_links_open_on_the_runs_table_without_credentials():
    assert (ui_url("http://alice:s3cretPW@127.0.0.1:5123/", "7")
            == "http://127.0.0.1:5123/#/experiments/7?workflowType=machine_learning")
    assert (ui_url("https://u:p@mlflow.example.com/prefix", "2", "abc")
            == "https://mlflow.example.com/prefix/#/experiments/2/runs/abc?workflowType=machine_learning")
    assert ui_url("sqlite:///mlflow.db", "1") == "http://127.0.0.1:5000/#/experiments/1?workflowType=machine_learning"
    assert ui_url(None, "1").startswith("http://127.0.0.1:5000/#/")


def test_a_rank_other_than_0_opens_no_run_and_records_nothing(tmp_path, monkeypatch):
    from gspo_bench.tracking import runs

    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.setenv("RANK", "1")
    assert runs.prior_run(uri, "e", "grpo", 0, "digest", True, print) == (None, None)
    logger = runs.open_run(load_config("smoke"), uri, "grpo", 0, {}, "arith")
    assert isinstance(logger, runs.OtherRankLogger) and logger.run_id is None
    runs.tag_run(logger, {"moe": "false"})
    runs.end_run(logger, "FAILED", 1.0, ("failed_reason", "x"))
    assert not (tmp_path / "m.db").exists()  # the store was never opened


def test_end_run_sets_the_reason_status_and_wall_time(tmp_path):
    from gspo_bench.tracking import runs

    uri = f"sqlite:///{tmp_path}/m.db"
    client = mlflow.MlflowClient(uri)
    run = client.create_run(client.create_experiment("e"))
    logger = SimpleNamespace(experiment=client, run_id=run.info.run_id)
    runs.tag_run(logger, {"engine": "hf"})
    runs.end_run(logger, "KILLED", 12.5, ("killed_reason", "SIGTERM at RL step 3"))
    got = client.get_run(run.info.run_id)
    assert got.info.status == "KILLED" and got.data.metrics["time/wall_s"] == 12.5
    assert got.data.tags["killed_reason"] == "SIGTERM at RL step 3" and got.data.tags["engine"] == "hf"
    # no experiment yet: nothing to resume, and nothing said
    said = []
    assert runs.prior_run(uri, "new", "grpo", 0, "digest", True, said.append) == (None, None) and not said
