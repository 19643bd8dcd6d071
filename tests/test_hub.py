"""Data-set tasks (gspo_bench.tasks.hub, kind hf): the built-in gsm8k and math500 specs on small local copies
built in the hub's own schemas and layouts, read through the same code a user's copy takes; nothing is fetched."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from mlflow_fakes import one_line

from gspo_bench.cli.main import main
from gspo_bench.config import TaskOptions
from gspo_bench.tasks import load_task, resolve_task_spec
from gspo_bench.tasks.hub import after_hashes, last_boxed, load_hf, locate
from gspo_bench.tasks.task import check_task_data

# openai/gsm8k, config main: columns question, answer (a rationale with calculator notes, then "#### N")
NATALIA = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
              "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
}


def gsm8k_rows(n: int, start: int) -> list[dict]:
    rows = []
    for i in range(start, start + n):
        a, b = 10 + i, 3 + 2 * i
        rows.append({"question": f"Tom has {a} apples and buys {b} more. How many apples does Tom have now?",
                     "answer": f"Tom starts with {a} apples.\nHe buys {b} more, so he has {a}+{b} = "
                               f"<<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"})
    return rows


GSM8K = {"train": [NATALIA, *gsm8k_rows(7, 0)], "test": gsm8k_rows(4, 100)}
SOCRATIC = {"train": gsm8k_rows(3, 500), "test": gsm8k_rows(2, 600)}  # the other config: must not leak in

# HuggingFaceH4/MATH-500: one split (test); problem, solution (ends in \boxed{}), answer, subject, level, unique_id
POLAR = {
    "problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer in the "
               "form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
    "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$  Also, if we draw the line connecting the origin and "
                "$(0,3),$ this line makes an angle of $\\frac{\\pi}{2}$ with the positive $x$-axis.\n\n"
                "Therefore, the polar coordinates are $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
    "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
    "unique_id": "test/precalculus/807.json",
}


def math500_rows(n: int) -> list[dict]:
    rows = [POLAR]
    for i in range(1, n):
        rows.append({"problem": f"What is $\\frac{{{i}}}{{{i + 1}}} + \\frac{{1}}{{{i + 1}}}$?",
                     "solution": f"The fractions share a denominator: $\\frac{{{i}+1}}{{{i + 1}}} = 1$, so the sum "
                                 "is $\\boxed{1}$.", "answer": "1", "subject": "Prealgebra", "level": 1 + i % 5,
                     "unique_id": f"test/prealgebra/{i}.json"})
    return rows


MATH500 = math500_rows(8)
GSM8K_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
  - split: test
    path: socratic/test-*
---
# gsm8k (a local test copy)
"""


def gsm8k_repo(root: Path, readme: bool = False) -> Path:
    """A folder laid out like the openai/gsm8k repository: <config>/<split>-00000-of-00001.parquet."""
    for config, splits in (("main", GSM8K), ("socratic", SOCRATIC)):
        (root / config).mkdir(parents=True)
        for split, rows in splits.items():
            datasets.Dataset.from_list(rows).to_parquet(root / config / f"{split}-00000-of-00001.parquet")
    if readme:
        (root / "README.md").write_text(GSM8K_README)
    return root


def math500_repo(root: Path) -> Path:
    """A folder laid out like the HuggingFaceH4/MATH-500 repository: test.jsonl."""
    root.mkdir(parents=True)
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MATH500))
    return root


@pytest.fixture(autouse=True)
def _empty_hf_caches(tmp_path, monkeypatch):
    """Empty hub and datasets caches, offline: only what a test builds can be found."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _gsm8k_copies(tmp_path: Path) -> dict[str, Path]:
    disk = tmp_path / "gsm8k-disk"
    datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in GSM8K.items()}).save_to_disk(str(disk))
    return {"save_to_disk": disk, "repo folder": gsm8k_repo(tmp_path / "gsm8k-repo"),
            "repo folder with README": gsm8k_repo(tmp_path / "gsm8k-readme", readme=True)}


@pytest.mark.parametrize("copy", ["save_to_disk", "repo folder", "repo folder with README"])
def test_gsm8k_from_a_local_copy(copy, tmp_path):
    path = _gsm8k_copies(tmp_path)[copy]
    task = load_task("gsm8k", 0, options=TaskOptions(path=str(path)))
    assert (len(task.train), len(task.eval)) == (len(GSM8K["train"]), len(GSM8K["test"]))  # main only, not socratic
    first = task.train[0]
    assert first["prompt"] == f"Question: {NATALIA['question']}\nAnswer:"
    assert first["answer"] == "72" and first["target"] == NATALIA["answer"]  # the rationale, uncut
    assert list(task.eval["answer"]) == [str(10 + i + 3 + 2 * i) for i in range(100, 104)]
    for ds in (task.train, task.eval):
        assert [task.verify(t, a) for t, a in zip(ds["target"], ds["answer"])] == [1.0] * len(ds)
    assert task.verify("so the answer is\n#### 71", "72") == 0.0
    assert task.verify("24 in May, 72 in all\n#### 72", "72") == 1.0


@pytest.mark.parametrize("copy", ["save_to_disk", "repo folder"])
def test_math500_from_a_local_copy_with_a_seeded_hold_out(copy, tmp_path):
    pytest.importorskip("math_verify")
    if copy == "save_to_disk":
        path = tmp_path / "math-disk"
        datasets.DatasetDict({"test": datasets.Dataset.from_list(MATH500)}).save_to_disk(str(path))
    else:
        path = math500_repo(tmp_path / "MATH-500")
    opts = TaskOptions(path=str(path), params={"n_eval": 3})
    task = load_task("math500", 0, options=opts)
    assert (len(task.train), len(task.eval)) == (5, 3)
    assert sorted(list(task.train["answer"]) + list(task.eval["answer"])) == sorted(r["answer"] for r in MATH500)
    assert load_task("math500", 0, options=opts).eval.to_dict() == task.eval.to_dict()  # seeded
    assert list(load_task("math500", 1, options=opts).eval["prompt"]) != list(task.eval["prompt"])
    polar = next(r for r in task.train.to_list() + task.eval.to_list() if r["answer"] == POLAR["answer"])
    assert polar["prompt"] == (POLAR["problem"] + "\nPlease reason step by step, and put your final answer within "
                               "\\boxed{}.")
    assert polar["target"] == POLAR["solution"]
    for ds in (task.train, task.eval):
        assert [task.verify(t, a) for t, a in zip(ds["target"], ds["answer"])] == [1.0] * len(ds)
    assert task.verify("so $\\boxed{(3, 0)}$", POLAR["answer"]) == 0.0
    assert task.verify("so $\\boxed{3}$", POLAR["answer"]) == 0.0  # the tuple, not its first number


def test_gsm8k_by_hub_id_from_the_hub_cache_layout(tmp_path):
    """What `hf download --repo-type dataset openai/gsm8k` leaves: datasets--openai--gsm8k/snapshots/<rev>/..."""
    rev = "e53f048856ff4f594e959d75785d2c2d37b678ee"
    repo = tmp_path / "hub" / "datasets--openai--gsm8k"
    gsm8k_repo(repo / "snapshots" / rev, readme=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    spec = resolve_task_spec("gsm8k")
    check_task_data(spec)  # found, before any work
    assert locate("openai/gsm8k", "main").where == str(repo / "snapshots" / rev)
    task = load_task("gsm8k", 0)
    assert len(task.train) == len(GSM8K["train"]) and task.train[0]["answer"] == "72"


def test_missing_data_set_says_how_to_get_it_and_how_to_point_at_a_copy():
    with pytest.raises(ValueError) as e:
        check_task_data(resolve_task_spec("gsm8k"))
    text = str(e.value)
    assert "\n" not in text and "task 'gsm8k'" in text and "(config main)" in text
    assert "hf download --repo-type dataset openai/gsm8k" in text
    assert "huggingface-cli download --repo-type dataset openai/gsm8k" in text
    assert "--set task.path=DIR" in text and "nothing is downloaded" in text
    with pytest.raises(ValueError, match="no such folder"):
        locate("./no/such/copy")


def test_fields_splits_and_extraction_are_checked(tmp_path):
    path = str(_gsm8k_copies(tmp_path)["save_to_disk"])
    with pytest.raises(ValueError, match=r"missing field\(s\) \['problem'\]"):
        load_hf(0, path, split="train", eval_split="test", template="{problem}")
    with pytest.raises(ValueError, match="no split 'validation'"):
        load_hf(0, path, split="validation", prompt_field="question")
    with pytest.raises(ValueError, match="extract='last'"):
        load_hf(0, path, prompt_field="question", extract="last")


def test_answer_extractors():
    assert after_hashes(NATALIA["answer"]) == "72" and after_hashes("x\n#### 1,000\n") == "1000"
    assert last_boxed(POLAR["solution"]) == POLAR["answer"]
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}" and last_boxed(" 5 ") == "5"


@pytest.mark.parametrize("name", ["gsm8k", "math500"])
def test_run_on_a_local_copy_finishes(name, tmp_path, capsys):
    path = gsm8k_repo(tmp_path / name) if name == "gsm8k" else math500_repo(tmp_path / name)
    db = tmp_path / "mlflow.db"
    code = main(["run", "--task", name, "--set", f"task.path={path}", "--preset", "smoke", "--algos", "grpo",
                 "--steps", "1", "--no-warmstart", "--no-progress", "--tracking-uri", f"sqlite:///{db}",
                 "--set", "rollout.max_new_tokens=24", "--set", "train.eval_prompts=4",
                 "--set", "train.eval_samples=0"])
    out = capsys.readouterr().out
    assert code == 0, out
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{db}")
    [run] = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "FINISHED" and run.data.tags["task"] == name
    assert run.data.params["task_options.path"] == str(path)


def test_run_without_the_data_set_is_one_line_exit_2_before_any_run(tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    code = main(["run", "--task", "gsm8k", "--preset", "smoke", "--algos", "grpo", "--no-progress",
                 "--tracking-uri", f"sqlite:///{db}"])
    text = one_line(capsys)
    assert code == 2 and "hf download --repo-type dataset openai/gsm8k" in text and "--set task.path=DIR" in text
    assert not db.exists()


def test_files_not_under_the_config_folder_say_the_layout_expected(tmp_path, capsys):
    flat = tmp_path / "gsm8k-flat"  # train-*.parquet and test-*.parquet straight in the folder, no main/
    flat.mkdir()
    for split, rows in GSM8K.items():
        datasets.Dataset.from_list(rows).to_parquet(flat / f"{split}-00000-of-00001.parquet")
    with pytest.raises(ValueError) as e:
        load_task("gsm8k", 0, options=TaskOptions(path=str(flat)))
    text = str(e.value)
    assert "\n" not in text and "BuilderConfig" not in text, text
    assert f"expected {flat}/main/train-*.parquet as on the hub" in text and "config_name: main" in text, text
    db = tmp_path / "mlflow.db"
    code = main(["run", "--task", "gsm8k", "--set", f"task.path={flat}", "--preset", "smoke", "--algos", "grpo",
                 "--no-progress", "--tracking-uri", f"sqlite:///{db}"])
    assert code == 2 and f"expected {flat}/main/train-*.parquet" in one_line(capsys)  # before the header line
    assert not db.exists()


def test_a_data_folder_file_not_utf8_is_named(tmp_path):
    folder = math500_repo(tmp_path / "MATH-500")
    data = folder / "test.jsonl"
    good = data.read_bytes()
    data.write_bytes(good + b'{"problem": "caf\xe9", "solution": "\\\\boxed{1}", "answer": "1"}\n')
    with pytest.raises(ValueError) as e:
        load_hf(0, str(folder), split="test", n_eval=2, prompt_field="problem")
    assert str(e.value) == f"{data}: not UTF-8 text (byte {len(good) + 16})"


def test_a_bad_row_in_a_data_folder_is_one_line_exit_2_before_the_header(tmp_path, capsys):
    folder = math500_repo(tmp_path / "MATH-500")
    with (folder / "test.jsonl").open("a") as f:
        f.write('{"problem": "1+1", "answer": \n')  # the last row is not JSON
    spec = tmp_path / "m.yaml"
    spec.write_text(f"kind: hf\nparams: {{path: {folder}, split: test, n_eval: 2, prompt_field: problem}}\n")
    db = tmp_path / "mlflow.db"
    code = main(["run", "--task", str(spec), "--preset", "smoke", "--algos", "grpo", "--no-progress",
                 "--tracking-uri", f"sqlite:///{db}"])
    text = one_line(capsys)
    assert code == 2 and "task 'm'" in text and str(folder) in text, text
    assert not db.exists()
