"""tracking/client.py, on a real SQLite store: every run across pages, a JSON artifact read back or None, the
run statuses, and where a run's artifacts live."""

from __future__ import annotations

import json

import mlflow
import pytest

from gspo_bench.tracking import client as tc


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    c = tc.client(uri)
    exp = c.create_experiment("e", artifact_location=str(tmp_path / "art"))
    return c, exp


def test_the_client_is_mlflows_on_that_uri(store):
    c, exp = store
    assert isinstance(c, mlflow.MlflowClient) and c.get_experiment(exp).name == "e"


def test_all_runs_reads_every_page(store, monkeypatch):
    c, exp = store
    ids = {c.create_run(exp, tags={"i": str(i)}).info.run_id for i in range(5)}
    monkeypatch.setattr(tc, "PAGE", 2)  # 5 runs in pages of 2: three pages
    assert {r.info.run_id for r in tc.all_runs(c, [exp])} == ids
    assert [r.data.tags["i"] for r in tc.all_runs(c, [exp], "tags.i = '3'")] == ["3"]


def test_artifact_json_reads_a_logged_dict_and_none_for_what_is_absent(store, tmp_path):
    c, exp = store
    run = c.create_run(exp)
    path = tmp_path / "events.json"
    path.write_text(json.dumps({"kind": "entropy_collapse", "step": 7}))
    c.log_artifact(run.info.run_id, str(path))
    uri = c.get_run(run.info.run_id).info.artifact_uri
    assert tc.artifact_json(c, uri, "events.json") == {"kind": "entropy_collapse", "step": 7}
    assert tc.artifact_json(c, uri, "missing.json") is None


def test_run_statuses_are_mlflows_names():
    assert tc.run_statuses() == ["FAILED", "FINISHED", "KILLED", "RUNNING", "SCHEDULED"]


def test_artifacts_on_this_machine_have_a_folder_and_a_server_has_none(store, tmp_path):
    c, exp = store
    run = c.create_run(exp)
    uri = c.get_run(run.info.run_id).info.artifact_uri
    assert tc.local_artifact_dir(uri) == tmp_path / "art" / run.info.run_id / "artifacts"
    assert tc.local_artifact_dir("mlflow-artifacts:/1/abc/artifacts") is None
    assert tc.local_artifact_dir("s3://bucket/1/abc/artifacts") is None
    # the repository MLflow writes through: a file written there lands in that folder
    src = tmp_path / "x.txt"
    src.write_text("x")
    tc.artifact_repository(c, run.info.run_id).log_artifact(str(src))
    assert (tmp_path / "art" / run.info.run_id / "artifacts" / "x.txt").read_text() == "x"


def test_a_run_is_opened_and_ended_once_with_its_reason_and_report(store):
    c, exp = store
    run_id = tc.start_run(c, exp, "report", {"kind": "report"})
    run = c.get_run(run_id)
    assert (run.info.run_name, run.data.tags["kind"], run.info.status) == ("report", "report", "RUNNING")
    tc.end_run(c, run_id, "FAILED", tags={"failed_reason": "rank 1 died"}, text=("Traceback ...", "rank1-error.txt"))
    run = c.get_run(run_id)
    assert (run.info.status, run.data.tags["failed_reason"]) == ("FAILED", "rank 1 died")
    assert [a.path for a in c.list_artifacts(run_id)] == ["rank1-error.txt"]


@pytest.mark.parametrize("raised, on_error, status", [
    (None, "FAILED", "FINISHED"), (ValueError, "FAILED", "FAILED"), (ValueError, "KILLED", "KILLED"),
    (KeyboardInterrupt, "FAILED", "KILLED")])
def test_a_run_s_lifetime_ends_it_with_the_block(store, raised, on_error, status):
    c, exp = store
    run_id = tc.start_run(c, exp, "study")
    if raised is None:
        with tc.run_lifetime(c, run_id, on_error) as inside:
            assert inside == run_id and c.get_run(run_id).info.status == "RUNNING"
    else:
        with pytest.raises(raised):  # what was raised goes on
            with tc.run_lifetime(c, run_id, on_error):
                raise raised("stopped")
    assert c.get_run(run_id).info.status == status
