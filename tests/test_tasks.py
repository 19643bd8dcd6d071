"""Task generators, verifiers and task spec files (gspo_bench.tasks)."""

from __future__ import annotations

import json
import re

import pytest

from gspo_bench.tasks import (
    GENERATORS,
    VERIFIERS,
    Task,
    TaskSpec,
    builtin_tasks,
    generate_arith,
    is_multi_turn,
    load_jsonl,
    load_task,
    make_environment,
    resolve_task_spec,
    scripted,
    verify_exact,
    verify_last_line,
)

ARITH = re.compile(r"^(\d+)\+(\d+)=$")


def parse(prompt: str) -> tuple[int, int]:
    m = ARITH.match(prompt)
    assert m, prompt
    return int(m.group(1)), int(m.group(2))


# ----------------------------------------------------------------------------- arith


def test_arith_sizes_columns_and_correct_answers():
    train, eval_ = generate_arith(3, min_digits=1, max_digits=2, n_train=300, n_eval=40)
    assert len(train) == 300 and len(eval_) == 40
    for ds in (train, eval_):
        assert sorted(ds.column_names) == ["answer", "prompt", "target"]
        for p, a, t in zip(ds["prompt"], ds["answer"], ds["target"]):
            x, y = parse(p)
            assert a == str(x + y)
            assert t == a


def test_arith_train_and_eval_are_disjoint_and_unique():
    train, eval_ = generate_arith(5, n_train=500, n_eval=100)
    tr, ev = list(train["prompt"]), list(eval_["prompt"])
    assert len(set(tr)) == len(tr)
    assert len(set(ev)) == len(ev)
    assert not set(tr) & set(ev)


def test_arith_small_space_uses_every_pair():
    # one digit each: 10 * 10 = 100 pairs; 10 for eval, the remaining 90 for train
    train, eval_ = generate_arith(0, min_digits=1, max_digits=1, n_train=1000, n_eval=10)
    assert len(eval_) == 10 and len(train) == 90
    pairs = {parse(p) for p in list(train["prompt"]) + list(eval_["prompt"])}
    assert pairs == {(a, b) for a in range(10) for b in range(10)}


def test_arith_is_deterministic_in_seed():
    a_tr, a_ev = generate_arith(11, n_train=50, n_eval=20)
    b_tr, b_ev = generate_arith(11, n_train=50, n_eval=20)
    c_tr, c_ev = generate_arith(12, n_train=50, n_eval=20)
    assert list(a_tr["prompt"]) == list(b_tr["prompt"])
    assert list(a_ev["prompt"]) == list(b_ev["prompt"])
    assert list(a_ev["prompt"]) != list(c_ev["prompt"])
    assert list(a_tr["prompt"]) != list(c_tr["prompt"])


@pytest.mark.parametrize("lo_d,hi_d,lo,hi", [(1, 1, 0, 9), (2, 2, 10, 99), (2, 3, 10, 999), (3, 3, 100, 999)])
def test_arith_digit_bounds(lo_d, hi_d, lo, hi):
    train, eval_ = generate_arith(1, min_digits=lo_d, max_digits=hi_d, n_train=60, n_eval=20)
    nums = [n for p in list(train["prompt"]) + list(eval_["prompt"]) for n in parse(p)]
    assert min(nums) >= lo and max(nums) <= hi
    # numbers are written without leading zeros, so the digit count is in range too
    assert all(lo_d <= len(str(n)) <= hi_d for n in nums)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(min_digits=0, max_digits=2), "min_digits"),
    (dict(min_digits=3, max_digits=2), "min_digits"),
    (dict(min_digits=1, max_digits=1, n_eval=100), "n_eval=100"),
    (dict(min_digits=1, max_digits=1, n_eval=250), "n_eval=250"),
])
def test_arith_bad_params_raise(kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        generate_arith(0, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(n_eval=-1, n_train=10), dict(n_eval=5, n_train=-3)])
def test_arith_negative_sizes_raise(kwargs):
    with pytest.raises(ValueError):
        generate_arith(0, **kwargs)


# ----------------------------------------------------------------------------- verifiers


@pytest.mark.parametrize("completion,answer,want", [
    ("42", "42", 1.0),
    ("  42\n", "42", 1.0),
    ("42", " 42 ", 1.0),
    ("\t42 \n\n", "42", 1.0),
    ("43", "42", 0.0),
    ("042", "42", 0.0),
    ("4 2", "42", 0.0),
    ("42 is it", "42", 0.0),
    ("x\n42", "42", 0.0),
    ("", "42", 0.0),
    ("   ", "42", 0.0),
    ("", "", 1.0),
])
def test_verify_exact(completion, answer, want):
    got = verify_exact(completion, answer)
    assert isinstance(got, float)
    assert got == want


@pytest.mark.parametrize("completion,answer,want", [
    ("42", "42", 1.0),
    ("scratch 1+1\n42", "42", 1.0),
    ("a\nb\n  42  \n\n   \n", "42", 1.0),
    ("a\r\n42\r\n", "42", 1.0),
    ("42\nsomething else", "42", 0.0),
    ("a\n43", "42", 0.0),
    ("a\n42 ok", "42", 0.0),
    ("", "42", 0.0),
    ("\n \n", "42", 0.0),
    ("", "", 0.0),  # no line at all: nothing matches, not even an empty answer
])
def test_verify_last_line(completion, answer, want):
    got = verify_last_line(completion, answer)
    assert isinstance(got, float)
    assert got == want


def test_registries_hold_the_builtins():
    assert VERIFIERS["exact"] is verify_exact
    assert VERIFIERS["last_line"] is verify_last_line
    assert GENERATORS["arith"] is generate_arith
    assert GENERATORS["jsonl"] is load_jsonl


# ----------------------------------------------------------------------------- spec files


def test_resolve_builtin_arith():
    spec = resolve_task_spec("arith")
    assert spec.name == "arith" and spec.kind == "arith" and spec.verifier == "exact"
    assert spec.max_new_tokens == 8
    assert spec.params == {"min_digits": 1, "max_digits": 2, "n_train": 20000, "n_eval": 1024}


def test_unknown_task_lists_the_builtins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        resolve_task_spec("no_such_task")
    msg = str(e.value)
    assert "'no_such_task'" in msg and "arith" in msg


def write_jsonl(path, n):
    rows = [{"q": f"what is {i} squared?", "a": i * i, "t": f"{i}*{i}\n{i * i}"} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return rows


def test_custom_jsonl_task_spec(tmp_path):
    data = tmp_path / "squares.jsonl"
    rows = write_jsonl(data, 20)
    spec = tmp_path / "squares.yaml"
    # no `name:` field: it defaults to the file's stem
    spec.write_text(
        "kind: jsonl\nverifier: last_line\nmax_new_tokens: 12\n"
        f"params:\n  path: {json.dumps(str(data))}\n  n_eval: 5\n"
        "  prompt_field: q\n  answer_field: a\n  target_field: t\n"
    )
    task = load_task(str(spec), seed=0)
    assert isinstance(task, Task)
    assert task.name == "squares"
    assert task.spec.max_new_tokens == 12 and task.spec.verifier == "last_line"
    assert len(task.train) == 15 and len(task.eval) == 5
    for ds in (task.train, task.eval):
        assert sorted(ds.column_names) == ["answer", "prompt", "target"]
    by_prompt = {r["q"]: r for r in rows}
    for ds in (task.train, task.eval):
        for p, a, t in zip(ds["prompt"], ds["answer"], ds["target"]):
            assert a == str(by_prompt[p]["a"])  # answers become strings
            assert t == by_prompt[p]["t"]
    tr, ev = set(task.train["prompt"]), set(task.eval["prompt"])
    assert not tr & ev
    assert tr | ev == set(by_prompt)
    # the verifier named by the spec is the one used
    assert task.verify("thinking\n49", "49") == 1.0
    assert task.verify("49\nthinking", "49") == 0.0
    # same seed, same split; the split depends on the seed
    again = load_task(str(spec), seed=0)
    assert list(again.eval["prompt"]) == list(task.eval["prompt"])
    other = load_task(str(spec), seed=1)
    assert set(other.eval["prompt"]) != ev


def test_jsonl_with_separate_eval_file_and_default_target(tmp_path):
    tr_rows = write_jsonl(tmp_path / "train.jsonl", 6)
    ev_path = tmp_path / "eval.jsonl"
    ev_path.write_text(json.dumps({"q": "what is 9 squared?", "a": 81}) + "\n")
    train, eval_ = load_jsonl(0, str(tmp_path / "train.jsonl"), eval_path=str(ev_path), prompt_field="q",
                              answer_field="a")
    assert len(train) == 6 and len(eval_) == 1
    assert eval_[0] == {"prompt": "what is 9 squared?", "answer": "81", "target": "81"}
    # without target_field the target is the answer
    assert list(train["target"]) == [str(r["a"]) for r in tr_rows]


def test_jsonl_missing_field_raises(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", 4)
    with pytest.raises(ValueError, match="missing field.*'question'"):
        load_jsonl(0, str(tmp_path / "d.jsonl"), prompt_field="question", answer_field="a")


@pytest.mark.parametrize("body,needle", [
    ("kind: nope\n", "unknown kind 'nope'"),
    ("kind: arith\nverifier: fuzzy\n", "unknown verifier 'fuzzy'"),
    ("kind: arith\ncolour: blue\n", "colour"),
    # verifier_params must fit the verifier's signature
    ("kind: countdown\nverifier: countdown\nverifier_params: {partial: 0.1}\n", "partial"),
    ("kind: arith\nverifier: exact\nverifier_params: {partial_credit: 0.1}\n", "partial_credit"),
    # a reward parameter must be a number in [0, 1]: 5 would pay a wrong answer 5x a right one
    ("kind: countdown\nverifier: countdown\nverifier_params: {partial_credit: 5}\n", "partial_credit=5 must be"),
    ("kind: countdown\nverifier: countdown\nverifier_params: {partial_credit: -0.1}\n", "partial_credit=-0.1 must"),
    ("kind: countdown\nverifier: countdown\nverifier_params: {partial_credit: .nan}\n", "partial_credit=nan must"),
    ("kind: countdown\nverifier: countdown\nverifier_params: {partial_credit: true}\n", "partial_credit=True must"),
    ("kind: countdown\nverifier: countdown\nverifier_params: {partial_credit: lots}\n", "partial_credit='lots'"),
])
def test_bad_spec_raises(tmp_path, body, needle):
    spec = tmp_path / "bad.yaml"
    spec.write_text(body)
    with pytest.raises(ValueError, match=re.escape(needle)):
        resolve_task_spec(str(spec))


def test_partial_credit_in_range_is_accepted_and_paid():
    spec = TaskSpec(name="cd", kind="countdown", verifier="countdown", verifier_params={"partial_credit": 1})
    assert spec.verifier_params == {"partial_credit": 1}
    assert TaskSpec(name="cd", kind="countdown", verifier="countdown",
                    verifier_params={"partial_credit": 0.0}).verifier_params["partial_credit"] == 0.0


def test_taskspec_error_lists_allowed():
    with pytest.raises(ValueError) as e:
        TaskSpec(name="x", kind="nope")
    assert "arith" in str(e.value) and "jsonl" in str(e.value)
    with pytest.raises(ValueError) as e:
        TaskSpec(name="x", kind="arith", verifier="nope")
    assert "exact" in str(e.value) and "last_line" in str(e.value)


def test_load_task_arith_from_custom_spec(tmp_path):
    spec = tmp_path / "add.yaml"
    spec.write_text("name: add\nkind: arith\nparams: {min_digits: 2, max_digits: 2, n_train: 30, n_eval: 10}\n")
    task = load_task(str(spec), seed=4)
    assert task.name == "add" and task.spec.verifier == "exact"
    assert len(task.train) == 30 and len(task.eval) == 10
    assert all(10 <= n <= 99 for p in task.eval["prompt"] for n in parse(p))
    assert task.verify(" 57 ", "57") == 1.0


# ----------------------------------------------------------------------------- every built-in task

# the generated tasks; the data-set ones (kind hf: gsm8k, math500) need their data, and tests/test_hub.py builds it
BUILTINS = sorted(n for n in builtin_tasks() if resolve_task_spec(n).kind != "hf")


@pytest.fixture(scope="module")
def loaded():
    """Each built-in task at seed 0, loaded once for this module."""
    cache: dict[str, Task] = {}

    def get(name: str) -> Task:
        if name not in cache:
            cache[name] = load_task(name, 0)
        return cache[name]

    return get


def test_builtins_include_the_new_tasks():
    assert {"arith", "arith_scratchpad", "countdown"} <= set(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_targets_verify(loaded, name):
    """The key check on the SFT targets: every eval row's target earns reward 1.0 against its answer (a
    multi-turn task's: the scripted solver's episode, whose transcript the target is, earns its full return)."""
    task = loaded(name)
    assert len(task.eval) > 0
    if is_multi_turn(task.spec.environment):
        from gspo_bench.tasks.environments.tools import CompactTools

        for row in task.eval.select(range(64)):
            env = make_environment(task.spec.environment, task, tools=CompactTools())
            segments, reward = scripted(env, row)
            assert "".join(t for _, t in segments) == row["target"] and reward > 0.3, (name, row)
            assert reward == 1.0 or name == "guess"  # guess pays less for every turn past the first
        return
    scores = [task.verify(t, a) for t, a in zip(task.eval["target"], task.eval["answer"])]
    assert scores == [1.0] * len(task.eval)
    # and a sample of train rows too
    sample = task.train.select(range(0, len(task.train), max(1, len(task.train) // 500)))
    assert all(task.verify(t, a) == 1.0 for t, a in zip(sample["target"], sample["answer"]))


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_splits_disjoint_deterministic_and_in_charset(loaded, name):
    from gspo_bench.models import CHARSET

    task = loaded(name)
    tr, ev = list(task.train["prompt"]), list(task.eval["prompt"])
    if name == "guess":  # one prompt, guess 1-16:, and a secret per row: its rows differ in their answers only
        assert set(tr) == set(ev) == {"guess 1-16:"} and set(task.eval["answer"]) == {str(i) for i in range(1, 17)}
    else:
        assert len(set(ev)) == len(ev) and len(set(tr)) == len(tr)
        assert not set(tr) & set(ev)
    again = load_task(name, 0)
    assert again.eval.to_dict() == task.eval.to_dict()
    assert list(again.train["prompt"]) == tr
    assert load_task(name, 1).eval.to_dict() != task.eval.to_dict()
    allowed = set(CHARSET)
    for ds in (task.train, task.eval):
        for col in ("prompt", "answer", "target"):
            assert set("".join(ds[col])) <= allowed, (name, col)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_max_new_tokens_covers_every_target_and_eos(loaded, name):
    task = loaded(name)
    longest = max(len(t) for ds in (task.train, task.eval) for t in ds["target"])
    assert longest + 1 <= task.spec.max_new_tokens  # one token per character, plus eos


def test_resolve_new_builtins():
    pad = resolve_task_spec("arith_scratchpad")
    assert pad.kind == "arith" and pad.verifier == "scratchpad" and pad.params["scratchpad"] is True
    cd = resolve_task_spec("countdown")
    assert cd.kind == "countdown" and cd.verifier == "countdown"
    assert cd.verifier_params == {"partial_credit": 0.0}


# ----------------------------------------------------------------------------- verifier_params


def test_verifier_params_reach_the_verifier(tmp_path):
    spec = tmp_path / "cd.yaml"
    spec.write_text("kind: countdown\nverifier: countdown\nmax_new_tokens: 24\n"
                    "params: {n_train: 20, n_eval: 5}\nverifier_params: {partial_credit: 0.1}\n")
    task = load_task(str(spec), seed=0)
    assert task.spec.verifier_params == {"partial_credit": 0.1}
    assert task.verify("12+5+3", "12 5 3|41") == pytest.approx(0.1)  # well formed, wrong value
    assert task.verify("12*3+5", "12 5 3|41") == 1.0
    assert task.verify("12+12", "12 5 3|41") == 0.0
    # without verifier_params the default is no partial credit
    plain = TaskSpec(name="cd", kind="countdown", verifier="countdown")
    assert plain.verifier_params == {}
    assert Task(plain, task.train, task.eval).verify("12+5+3", "12 5 3|41") == 0.0


def test_empty_verifier_params_in_yaml(tmp_path):
    spec = tmp_path / "ok.yaml"
    spec.write_text("kind: arith\nverifier_params:\nparams:\n")
    s = resolve_task_spec(str(spec))
    assert s.verifier_params == {} and s.params == {}


def test_missing_optional_extra_fails_when_the_spec_is_read(monkeypatch):
    from gspo_bench.tasks import verifiers

    monkeypatch.setitem(verifiers.VERIFIER_REQUIRES, "math_verify", ("no_such_module_xyz", "math"))
    with pytest.raises(ImportError, match=r"pip install 'gspo-bench\[math\]'"):
        TaskSpec(name="m", kind="file", verifier="math_verify")


def test_math_verify_task_when_installed(tmp_path):
    pytest.importorskip("math_verify")
    data = tmp_path / "m.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{i}/2=", "answer": str(i / 2)}) for i in range(1, 9)) + "\n")
    spec = tmp_path / "m.yaml"
    spec.write_text("kind: file\nverifier: math_verify\nparams: {path: m.jsonl, n_eval: 2}\n")
    task = load_task(str(spec), seed=0)
    for t, a in zip(task.eval["target"], task.eval["answer"]):
        assert task.verify(t, a) == 1.0
    assert task.verify("\\frac{3}{2}", "1.5") == 1.0
    assert task.verify("\\frac{3}{2}", "2.5") == 0.0


def test_check_task_data_uses_the_loader_fields(tmp_path):
    from gspo_bench.tasks.task import check_task_data

    (tmp_path / "d.jsonl").write_text('{"q": "1+1=", "a": "2"}\n{"q": "2+2=", "a": "4"}\n')
    ok = TaskSpec(name="f", kind="file", params={"path": str(tmp_path / "d.jsonl"), "prompt_field": "q",
                                                  "answer_field": "a"})
    check_task_data(ok)  # the spec's own field names: passes
    bad = TaskSpec(name="f", kind="file", params={"path": str(tmp_path / "d.jsonl")})
    with pytest.raises(ValueError, match=r"missing field\(s\) \['answer', 'prompt'\]"):
        check_task_data(bad)  # the loader's defaults, prompt / answer: missing
    check_task_data(TaskSpec(name="a", kind="arith"))  # generated data: nothing to check


# -- bounded inputs: rows the model cannot take are dropped by a documented rule ------------------------------
def _file_task(tmp_path, rows: list[dict], extra: str = "", n_eval: int = 2):
    from gspo_bench.tasks import load_task

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = tmp_path / "bounded.yaml"
    spec.write_text(f"kind: file\nmax_new_tokens: 8\n{extra}params: {{path: rows.jsonl, n_eval: {n_eval}}}\n")
    return str(spec), load_task


class _Counting:
    """The char tokenizer, recording the longest text it was asked to tokenize."""

    def __init__(self):
        from gspo_bench.models import char_tokenizer

        self.tok, self.longest = char_tokenizer(), 0

    def get_vocab(self):
        return self.tok.get_vocab()

    def __call__(self, text, **kw):
        self.longest = max(self.longest, len(text))
        return self.tok(text, **kw)


def test_rows_longer_than_the_model_takes_are_dropped_and_counted(tmp_path, monkeypatch):
    from gspo_bench.tasks.task import fit_to_model

    ok = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]
    long_prompt = {"prompt": "7" * 60 + "=", "answer": "1"}  # 61 tokens > P = 64 - 8 = 56
    long_target = {"prompt": "50+50=", "answer": "1" * 60}  # prompt + answer (the target) + eos: 67 > 64
    huge = {"prompt": "9" * 10_000_000 + "=", "answer": "1"}  # the 10 MB row
    monkeypatch.chdir(tmp_path)
    ref, load_task = _file_task(tmp_path, ok + [long_prompt, long_target, huge], n_eval=2)
    task = load_task(ref, seed=0)
    n_train, n_eval = len(task.train), len(task.eval)
    tok, lines = _Counting(), []
    fitted = fit_to_model(task, tok, context=64, max_new_tokens=8, log=lines.append)
    kept = list(fitted.train["prompt"]) + list(fitted.eval["prompt"])
    assert sorted(kept) == sorted(r["prompt"] for r in ok)
    assert len(lines) == 1 and re.search(r"dropped \d+ of %d train rows and \d+ of %d eval rows" % (n_train, n_eval),
                                         lines[0])
    assert "prompt > 56 tokens" in lines[0] and "prompt + answer > 64" in lines[0]
    assert tok.longest < 1000  # the 10 MB prompt was dropped on its length alone, never tokenized
    assert fit_to_model(fitted, tok, 64, 8, log=lines.append) is fitted and len(lines) == 1  # nothing to drop


def test_max_prompt_tokens_and_an_empty_split_after_dropping():
    import datasets

    from gspo_bench.models import char_tokenizer
    from gspo_bench.tasks.task import Task, TaskSpec, fit_to_model

    def split(*prompts):
        return datasets.Dataset.from_dict({"prompt": list(prompts), "answer": ["1"] * len(prompts),
                                           "target": ["1"] * len(prompts)})

    spec = TaskSpec(name="b", kind="arith", max_prompt_tokens=5)
    task = Task(spec, split("8+8=", "10+10=", "9+9="), split("7+7=", "12+12="))
    fitted = fit_to_model(task, char_tokenizer(), 512, 8, log=lambda m: None)
    assert list(fitted.train["prompt"]) == ["8+8=", "9+9="] and list(fitted.eval["prompt"]) == ["7+7="]
    with pytest.raises(ValueError, match="no eval row fits the model"):
        fit_to_model(Task(spec, task.train, split("12+12=")), char_tokenizer(), 512, 8, log=lambda m: None)
    with pytest.raises(ValueError, match="leaves no room for a prompt"):
        fit_to_model(task, char_tokenizer(), 16, 16, log=lambda m: None)
    for bad in (0, -3, 2.5, True, "10"):
        with pytest.raises(ValueError, match="max_prompt_tokens"):
            TaskSpec(name="b", kind="arith", max_prompt_tokens=bad)


def test_a_10_mb_row_keeps_peak_memory_flat(tmp_path):
    """Peak RSS of a whole `run` (warm start included) with and without a 10 MB prompt in the data."""
    import subprocess
    import sys

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(20) for b in range(20)]
    peaks = {}
    for name, extra in (("plain", []), ("huge", [{"prompt": "9" * 10_000_000 + "=", "answer": "1"}])):
        d = tmp_path / name
        d.mkdir()
        (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + extra))
        (d / "t.yaml").write_text("kind: file\nmax_new_tokens: 4\nparams: {path: rows.jsonl, n_eval: 20}\n")
        cmd = [sys.executable, "-m", "gspo_bench", "run", "--preset", "smoke", "--algos", "grpo", "--task",
               str(d / "t.yaml"), "--steps", "1", "--set", "warmstart.max_steps=4", "--set", "warmstart.eval_every=2",
               "--tracking-uri", f"sqlite:///{d}/m.db", "--no-progress"]
        # a parent per run, so RUSAGE_CHILDREN's peak is that run's alone
        wrapper = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True);"
                   " print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(p.stdout)")
        out = subprocess.run([sys.executable, "-c", wrapper, *cmd], cwd=d, capture_output=True, text=True,
                             timeout=900).stdout
        code, kib = out.split("\n", 1)[0].split()
        assert code == "0", out[-3000:]
        peaks[name] = int(kib) / 1024
        if name == "huge":
            assert re.search(r"dropped 1 of \d+ train rows", out), out[-3000:]
    assert peaks["huge"] - peaks["plain"] < 200, peaks  # MiB: the row itself, a few copies, never a padded batch


@pytest.mark.parametrize("body, rows", [
    (b'{"a": 1}\n{"a": 2}\n', 2),
    (b'{"a": 1}\n\n  \n{"a": 2}', 2),  # blank lines do not count, nor does a missing last newline
    (b'{"a": 1}\n', 1),
    (b"\n\n", 0),
])
def test_count_rows_counts_the_non_blank_lines_of_a_jsonl_file(tmp_path, body, rows):
    from pathlib import Path

    from gspo_bench.tasks.generators import count_rows

    f = tmp_path / "d.jsonl"
    f.write_bytes(body)
    assert count_rows(f, "json") == rows
    big = tmp_path / "big.jsonl"  # a row longer than the read chunk counts once
    big.write_bytes(b'{"a": "' + b"x" * (3 << 20) + b'"}\n' + body)
    assert count_rows(big, "json") == rows + 1
    assert count_rows(Path(tmp_path / "d.json"), "json") is None  # a JSON array is counted by loading it


def test_count_rows_reads_a_parquet_footer(tmp_path):
    import datasets

    from gspo_bench.tasks.generators import count_rows

    datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3="], "answer": ["2", "4", "6"]}).to_parquet(
        tmp_path / "d.parquet")
    assert count_rows(tmp_path / "d.parquet", "parquet") == 3


# -- a system message needs a chat template to be seen ----------------------------------------------------------
def test_a_system_message_with_chat_false_is_refused(tmp_path):
    from gspo_bench.config import TaskOptions

    with pytest.raises(ValueError, match=r"task 'a': a system message needs chat: auto or true"):
        TaskSpec(name="a", kind="arith", chat=False, system="Add the numbers.")
    spec = tmp_path / "sys.yaml"
    spec.write_text("kind: arith\nchat: false\nsystem: |\n  Add.\n  Then stop.\n")
    with pytest.raises(ValueError) as e:
        resolve_task_spec(str(spec))
    assert "\n" not in str(e.value) and "task 'sys'" in str(e.value)  # one line: the message is not echoed
    # the built-in arith says chat: false, so --set task.system alone is refused; with chat: auto it is kept
    with pytest.raises(ValueError, match="a system message needs chat: auto or true"):
        resolve_task_spec("arith", TaskOptions(system="Add."))
    assert resolve_task_spec("arith", TaskOptions(system="Add.", chat="auto")).system == "Add."
    assert TaskSpec(name="a", kind="arith", chat=False, system=None).system is None


# -- a data file that is not UTF-8 is named -------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_data_file_not_utf8_past_its_head_is_named_with_the_byte(tmp_path, suffix):
    from gspo_bench.tasks.generators import HEAD_BYTES

    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(HEAD_BYTES // 20)]
    good = "".join(json.dumps(r) + "\n" for r in rows).encode()
    assert len(good) > HEAD_BYTES  # past the head the cheap check reads
    bad = b'{"prompt": "caf\xe9=", "answer": "1"}\n'
    data = tmp_path / f"late{suffix}"
    data.write_bytes(good + bad)
    spec = tmp_path / "late.yaml"
    spec.write_text(f"kind: file\nparams: {{path: {data.name}, n_eval: 4}}\n")
    with pytest.raises(ValueError) as e:
        load_task(str(spec), seed=0)
    text = str(e.value)
    assert f"{data}: not UTF-8 text (byte {len(good) + 15})" in text and "\n" not in text, text
