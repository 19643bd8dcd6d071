"""Credentials never appear in any output: ``redact`` itself, then ``run`` + ``report`` against a real
``mlflow server`` reached through ``http://alice:<password>@...``, and ``tune``'s best-params file.

The end-to-end test greps everything the commands left behind (console, every param / tag / run name of every
run read back from the server, every artifact downloaded, every file written) for the planted password.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
import yaml
from rich.table import Table

from gspo_bench.cli.main import main
from gspo_bench.tracking.redact import MASK, RedactingConsole, redact, redact_nested
from gspo_bench.tuning.study import redact as study_redact
from tests.mlflow_server import running_server

ENV = {"FOO_PASSWORD": "hunter22", "HF_TOKEN": "hf_AbC/123", "SHORT_TOKEN": "abc", "EMPTY_PASSWORD": "",
       "PATH": "/usr/bin", "HOME_DIR_TOKENISH": "notasecret"}


# -- redact, pure ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("uri, expected", [
    ("http://alice:s3cretPW@host", "http://alice:***@host"),
    ("https://alice:s3cretPW@mlflow.example.com:5000/path?x=1", "https://alice:***@mlflow.example.com:5000/path?x=1"),
    ("postgresql+psycopg://bench:pw-1@db.local:5432/optuna", "postgresql+psycopg://bench:***@db.local:5432/optuna"),
    ("mysql://root:p%40ss@localhost/optuna", "mysql://root:***@localhost/optuna"),
    ("mysql+pymysql://root:p@ss@localhost/optuna", "mysql+pymysql://root:***@localhost/optuna"),  # last '@' ends it
    ("redis://:onlyapassword@cache:6379/0", "redis://:***@cache:6379/0"),
])
def test_the_password_of_a_uri_is_masked(uri, expected):
    assert redact(uri, {}) == expected
    assert redact(f"--tracking-uri '{uri}' and more", {}) == f"--tracking-uri '{expected}' and more"
    assert redact(f"- tracking URI: `{uri}`", {}) == f"- tracking URI: `{expected}`"  # report.md's backticks kept


@pytest.mark.parametrize("text", [
    "postgresql://nobody@127.0.0.1:1/x",  # a user without a password is no secret
    "http://127.0.0.1:5000/#/experiments/1", "sqlite:///results/mlflow.db", "sqlite:////abs/optuna.db",
    "python -m gspo_bench run --preset smoke --set rollout.max_new_tokens=64 --set train.lr=3e-4",
    "mail me at alice@example.com: ok", "eval/pass1 0.25 -> 0.5", "",
])
def test_text_without_secrets_is_returned_unchanged(text):
    assert redact(text, ENV) == text


def test_secret_query_parameters_are_masked_others_kept():
    assert (redact("postgresql://h/db?sslmode=require&password=pw1&user=u", {})
            == "postgresql://h/db?sslmode=require&password=***&user=u")
    assert redact("https://reg.example/api?token=abc123#frag", {}) == "https://reg.example/api?token=***#frag"
    assert (redact("http://h/x?access_token=a&API_KEY=b&client_secret=c&token_type=bearer", {})
            == "http://h/x?access_token=***&API_KEY=***&client_secret=***&token_type=bearer")


def test_env_password_and_token_values_are_masked_wherever_they_occur():
    text = "run --set model.name=hunter22 --config /tmp/hf_AbC/123/x.yaml hf_AbC%2F123 abc"
    assert redact(text, ENV) == "run --set model.name=*** --config /tmp/***/x.yaml *** abc"  # 'abc': too short
    assert redact("hunter22hunter22", ENV) == "******"
    assert redact("nothing here", {"X_TOKEN": "here"}) == "nothing ***"  # 4 characters: masked
    assert redact("a notasecret value", ENV) == "a notasecret value"  # HOME_DIR_TOKENISH: not a *_TOKEN name
    assert redact("http://alice:hunter22@h", ENV) == "http://alice:***@h"
    assert redact("plantedX123", None) == "plantedX123"  # env=None reads os.environ, which lacks it


def test_env_default_is_os_environ(monkeypatch):
    monkeypatch.setenv("GSPO_REDACT_UNIT_TOKEN", "tok-from-env-42")
    assert redact("a tok-from-env-42 b") == "a *** b"


def test_redact_is_idempotent_and_the_tuning_module_uses_it():
    text = "postgresql://u:pw@h/db?token=t --set x=hunter22 http://a:b@c"
    once = redact(text, ENV)
    assert redact(once, ENV) == once and "pw" not in once and "hunter22" not in once
    assert study_redact is redact


def test_redact_nested_masks_every_string_and_keeps_the_rest():
    data = {"tracking": {"tracking_uri": "http://alice:s3cretPW@h", "experiment": "e"},
            "seeds": [0, 1], "lr": 3e-4, "flag": None, "ok": True,
            "list": ["sqlite:///x.db", ("hunter22", 3)], "hunter22": "key too"}
    out = redact_nested(data, ENV)
    assert out == {"tracking": {"tracking_uri": "http://alice:***@h", "experiment": "e"},
                   "seeds": [0, 1], "lr": 3e-4, "flag": None, "ok": True,
                   "list": ["sqlite:///x.db", (MASK, 3)], MASK: "key too"}
    assert data["tracking"]["tracking_uri"] == "http://alice:s3cretPW@h"  # a copy: the caller's dict is intact


def test_the_console_redacts_strings_and_rendered_tables(monkeypatch):
    monkeypatch.setenv("GSPO_REDACT_UNIT_TOKEN", "tok-from-env-42")
    console = RedactingConsole(width=60, record=True, highlight=False)
    with console.capture() as cap:
        console.print("MLflow: mlflow ui --backend-store-uri http://alice:s3cretPW@host:5000/a/very/long/path/"
                      "that/wraps/over/the/sixty/columns")
        t = Table(title="tune")
        t.add_column("where")
        t.add_row("http://bob:pw2@h")
        t.add_row("tok-from-env-42")
        console.print(t)
    text = cap.get()
    assert "s3cretPW" not in text and "pw2" not in text and "tok-from-env-42" not in text
    assert "alice:***@" in text and "bob:***@h" in text


# -- a real MLflow server, run + report --------------------------------------------------------------------------
PASSWORD = "s3cretPW"


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` on a free localhost port with a SQLite store and proxied artifacts; its host:port."""
    with running_server(tmp_path / "server") as s:
        yield f"127.0.0.1:{s.port}"


def _files_containing(root: Path, needle: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_run_and_report_against_a_server_leave_the_password_nowhere(mlflow_server, mixed_task, tmp_path,
                                                                     monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)  # the CLI's default applies
    uri = f"http://alice:{PASSWORD}@{mlflow_server}"
    masked = f"http://alice:{MASK}@{mlflow_server}"
    sets = ["warmstart.enabled=false", "rollout.prompts_per_step=4", "rollout.group_size=4", "train.steps=2",
            "train.eval_prompts=8", "train.eval_every=1", "train.eval_samples=2", "train.minibatches=2",
            f"task={mixed_task}"]
    assert main(["run", "--preset", "smoke", "--algos", "grpo", "--tracking-uri", uri, "--experiment", "redact",
                 "--no-progress", *[x for s in sets for x in ("--set", s)]]) == 0
    out = tmp_path / "report"
    assert main(["report", "--tracking-uri", uri, "--experiment", "redact", "--out", str(out)]) == 0
    console = capfd.readouterr()
    text = console.out + console.err
    assert PASSWORD not in text, text
    # the run's MLflow line: the server's UI page, without the credentials
    assert f"open http://{mlflow_server}/#/experiments/" in text.replace("\n", "")

    client = mlflow.MlflowClient(f"http://{mlflow_server}")  # read back without credentials: the server has none
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert sorted(r.data.tags.get("kind", "run") for r in runs) == ["report", "run"]
    downloads = tmp_path / "downloads"
    for r in runs:
        recorded = {**r.data.params, **r.data.tags, "run_name": r.info.run_name or ""}
        assert not [k for k, v in recorded.items() if PASSWORD in k or PASSWORD in v], recorded
        (downloads / r.info.run_id).mkdir(parents=True)
        client.download_artifacts(r.info.run_id, "", str(downloads / r.info.run_id))
    [run] = [r for r in runs if r.data.tags.get("kind") != "report"]
    assert run.data.params["tracking.tracking_uri"] == masked
    assert yaml.safe_load((downloads / run.info.run_id / "config.yaml").read_text())["tracking"] == {
        "tracking_uri": masked, "experiment": "redact", "artifact_location": None, "retry_budget_s": 60.0,
        "connect_timeout_s": 5.0}
    assert len(list(downloads.rglob("*"))) > 3 and not _files_containing(downloads, PASSWORD)

    assert not _files_containing(out, PASSWORD) and not _files_containing(tmp_path / "mlruns", PASSWORD)
    md = (out / "report.md").read_text()
    [command] = [line for line in md.splitlines() if line.startswith("- command: ")]
    assert f"--tracking-uri '{masked}'" in command and f"- tracking URI: `{masked}`" in md  # shlex quotes ***


# -- tune: the best-params file's source line --------------------------------------------------------------------
TOKEN = "plantedTOKEN123"


def test_tune_writes_neither_an_env_token_nor_a_storage_password(mixed_task, tmp_path, monkeypatch, capfd):
    """The token is an env value (GSPO_BENCH_TEST_TOKEN) that is also part of the ``--config`` path, so the
    command line echoed into the YAML's ``source:`` and the console holds it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GSPO_BENCH_TEST_TOKEN", TOKEN)
    folder = tmp_path / TOKEN
    folder.mkdir()
    tiny = folder / "tiny.yaml"
    tiny.write_text(yaml.safe_dump({"warmstart": {"enabled": False}, "task": mixed_task,
                                    "rollout": {"prompts_per_step": 4, "group_size": 4},
                                    "train": {"steps": 2, "minibatches": 2, "eval_every": 1, "eval_prompts": 8,
                                              "eval_samples": 2, "lr": 1e-3}}))
    uri, out = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "tuning"
    assert main(["tune", "--algo", "grpo", "--preset", "smoke", "--config", str(tiny), "--trials", "1",
                 "--study", "redact", "--storage", f"sqlite:///{tmp_path}/optuna.db", "--tracking-uri", uri,
                 "--out", str(out), "--no-progress"]) == 0
    console = capfd.readouterr()
    assert TOKEN not in console.out + console.err
    [best] = out.glob("*.yaml")
    text = best.read_text()
    assert TOKEN not in text and f"--config '{tmp_path}/{MASK}/tiny.yaml'" in yaml.safe_load(text)["source"]
    client = mlflow.MlflowClient(uri)
    for r in client.search_runs([client.get_experiment_by_name("gspo_bench").experiment_id]):
        assert not [k for k, v in {**r.data.params, **r.data.tags}.items() if TOKEN in k or TOKEN in v]
    assert not _files_containing(tmp_path / "mlruns", TOKEN)


def test_the_source_line_masks_a_storage_password(tmp_path):
    """``write_best`` alone, with a postgresql storage URL holding a password in the command it records."""
    from types import SimpleNamespace

    from gspo_bench.tuning.study import TuneRequest, write_best

    best = SimpleNamespace(value=0.5, number=0, params={"eps_high": 0.2}, user_attrs={"overrides": {}})
    study = SimpleNamespace(study_name="s", best_trial=best, get_trials=lambda deepcopy=False: [])
    storage = "postgresql://u:pw@h/db"
    req = TuneRequest(algo="grpo", storage=storage, preset="smoke", out=str(tmp_path),
                      command=f"python -m gspo_bench tune --algo grpo --storage {storage}")
    text = write_best(study, req, "grpo", "eval/reward_mean").read_text()
    assert ":pw@" not in text and text.count("postgresql://u:***@h/db") == 2  # the study's storage, the command
