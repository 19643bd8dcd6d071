"""Generators and loaders (gspo_bench.tasks.generators): scratchpad arith, countdown, local files."""

from __future__ import annotations

import json
import re
from collections import Counter

import datasets
import pytest

from gspo_bench.tasks.generators import (
    GENERATORS,
    column_addition,
    generate_arith,
    generate_countdown,
    load_file,
    load_jsonl,
    render,
)
from gspo_bench.tasks import load_task
from gspo_bench.tasks.verifiers import (
    evaluate,
    parse_countdown_answer,
    parse_expression,
    verify_countdown,
    verify_gsm8k,
    verify_scratchpad,
)

COUNTDOWN_PROMPT = re.compile(r"^(\d+(?: \d+)*) -> (\d+):$")


def test_registry():
    assert GENERATORS["arith"] is generate_arith
    assert GENERATORS["countdown"] is generate_countdown
    assert GENERATORS["file"] is load_file
    assert GENERATORS["jsonl"] is load_file and load_jsonl is load_file  # the old name is an alias


# ----------------------------------------------------------------------------- scratchpad arith


@pytest.mark.parametrize("a,b,want", [
    (237, 485, "7+5+0=12 c1\n3+8+1=12 c1\n2+4+1=7 c0\n=722"),
    (999, 1, "9+1+0=10 c1\n9+0+1=10 c1\n9+0+1=10 c1\n=1000"),  # carries ripple past the shorter number
    (1, 999, "1+9+0=10 c1\n0+9+1=10 c1\n0+9+1=10 c1\n=1000"),
    (4321, 1234, "1+4+0=5 c0\n2+3+0=5 c0\n3+2+0=5 c0\n4+1+0=5 c0\n=5555"),
    (9999, 9999, "9+9+0=18 c1\n9+9+1=19 c1\n9+9+1=19 c1\n9+9+1=19 c1\n=19998"),
    (0, 0, "0+0+0=0 c0\n=0"),
])
def test_column_addition(a, b, want):
    assert column_addition(a, b) == want
    assert verify_scratchpad(want, str(a + b)) == 1.0


def test_column_addition_lines_are_consistent():
    # every line x+y+c=s cK has s = x+y+c, K = s//10, and K is the next line's carry in
    for a, b in [(58, 967), (1005, 8995), (123, 4567)]:
        *lines, last = column_addition(a, b).split("\n")
        carry = 0
        digits = []
        for ln in lines:
            x, y, c, s, k = map(int, re.fullmatch(r"(\d)\+(\d)\+(\d)=(\d+) c(\d)", ln).groups())
            assert c == carry and s == x + y + c and k == s // 10
            digits.append(s % 10)
            carry = k
        assert int(str(carry) + "".join(map(str, reversed(digits)))) == a + b
        assert last == f"={a + b}"


def test_scratchpad_flag_keeps_prompts_and_answers():
    plain_tr, plain_ev = generate_arith(2, min_digits=3, max_digits=4, n_train=100, n_eval=20)
    pad_tr, pad_ev = generate_arith(2, min_digits=3, max_digits=4, n_train=100, n_eval=20, scratchpad=True)
    for plain, pad in ((plain_tr, pad_tr), (plain_ev, pad_ev)):
        assert list(plain["prompt"]) == list(pad["prompt"])
        assert list(plain["answer"]) == list(pad["answer"])
        for p, a, t in zip(pad["prompt"], pad["answer"], pad["target"]):
            x, y = map(int, p.rstrip("=").split("+"))
            assert t == column_addition(x, y) and a == str(x + y)


@pytest.mark.parametrize("seed", [0, 1])
def test_arith_scratchpad_targets_are_30_to_60_tokens(seed):
    # the whole built-in data set, train and eval: 3-4 digits give 37..54 characters
    task = load_task("arith_scratchpad", seed)
    for ds in (task.train, task.eval):
        lengths = [len(t) for t in ds["target"]]
        assert 30 <= min(lengths) and max(lengths) <= 60
        assert max(lengths) + 1 <= task.spec.max_new_tokens  # + eos
    assert min(len(t) for t in task.train["target"]) == 37  # both 3-digit, 3-digit sum
    assert max(len(t) for t in task.train["target"]) == 54  # 4 columns of 2-digit sums, 5-digit sum


# ----------------------------------------------------------------------------- countdown


@pytest.mark.parametrize("tree,want", [
    (("+", ("*", 12, 3), 5), "12*3+5"),
    (("*", ("+", 12, 3), 5), "(12+3)*5"),
    (("*", 5, ("+", 12, 3)), "5*(12+3)"),
    (("-", 12, ("-", 5, 3)), "12-(5-3)"),
    (("-", ("-", 12, 5), 3), "12-5-3"),
    (("+", 12, ("-", 5, 3)), "12+5-3"),
    (("/", 24, ("*", 2, 3)), "24/(2*3)"),
    (("*", 24, ("/", 6, 3)), "24*6/3"),
    (("/", ("+", 9, 3), ("-", 7, 3)), "(9+3)/(7-3)"),
    (7, "7"),
])
def test_render(tree, want):
    assert render(tree) == want
    parsed, _ = parse_expression(want)
    assert evaluate(parsed) == evaluate(tree)


def test_countdown_rows_are_solvable_and_well_formed():
    train, eval_ = generate_countdown(3, n_train=400, n_eval=50)
    assert len(train) == 400 and len(eval_) == 50
    sizes = Counter()
    for ds in (train, eval_):
        assert sorted(ds.column_names) == ["answer", "prompt", "target"]
        for p, a, t in zip(ds["prompt"], ds["answer"], ds["target"]):
            m = COUNTDOWN_PROMPT.match(p)
            assert m, p
            numbers, target = [int(n) for n in m.group(1).split()], int(m.group(2))
            assert parse_countdown_answer(a) == (numbers, target)
            assert 3 <= len(numbers) <= 4 and all(1 <= n <= 25 for n in numbers)
            assert 10 <= target <= 100 and target not in numbers
            tree, used = parse_expression(t)
            assert sorted(used) == sorted(numbers)  # the target expression uses every number once
            assert evaluate(tree) == target
            assert verify_countdown(t, a) == 1.0
            sizes[len(numbers)] += 1
    assert set(sizes) == {3, 4}


def test_countdown_disjoint_and_deterministic():
    train, eval_ = generate_countdown(5, n_train=500, n_eval=100)

    def keys(ds):
        return [(tuple(sorted(parse_countdown_answer(a)[0])), parse_countdown_answer(a)[1]) for a in ds["answer"]]

    tr, ev = keys(train), keys(eval_)
    assert len(set(tr)) == len(tr) and len(set(ev)) == len(ev)
    assert not set(tr) & set(ev)  # not even a reordering of the numbers crosses over
    assert not set(train["prompt"]) & set(eval_["prompt"])
    again_tr, again_ev = generate_countdown(5, n_train=500, n_eval=100)
    assert again_tr.to_dict() == train.to_dict() and again_ev.to_dict() == eval_.to_dict()
    _, other_ev = generate_countdown(6, n_train=500, n_eval=100)
    assert list(other_ev["prompt"]) != list(eval_["prompt"])


def test_countdown_params():
    train, eval_ = generate_countdown(0, min_numbers=2, max_numbers=2, max_number=9, min_target=1, max_target=30,
                                      ops="+*", n_train=20, n_eval=10)
    for p, t in zip(list(train["prompt"]) + list(eval_["prompt"]), list(train["target"]) + list(eval_["target"])):
        numbers = [int(n) for n in COUNTDOWN_PROMPT.match(p).group(1).split()]
        assert len(numbers) == 2 and max(numbers) <= 9
        assert set(t) <= set("0123456789+*()")


@pytest.mark.parametrize("kwargs,needle", [
    (dict(min_numbers=1), "min_numbers"),
    (dict(min_numbers=4, max_numbers=3), "min_numbers"),
    (dict(max_number=0), "max_number"),
    (dict(min_target=50, max_target=10), "min_target"),
    (dict(ops="+^"), "ops"),
    (dict(ops=""), "ops"),
    (dict(n_eval=0), "n_eval"),
    (dict(n_train=-1), "n_train"),
    # a space too small for the sizes asked for raises instead of looping
    (dict(min_numbers=2, max_numbers=2, max_number=3, min_target=1, max_target=9, n_train=100, n_eval=5),
     "distinct problems"),
    (dict(ops="/", min_numbers=2, max_numbers=2, max_number=2, min_target=10), "no target"),
])
def test_countdown_bad_params_raise(kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        generate_countdown(0, **kwargs)


# ----------------------------------------------------------------------------- local files

GSM_ROWS = [
    {"question": f"Tom has {i} apples and buys {i + 1} more. How many?",
     "answer": f"{i}+{i + 1} = <<{i}+{i + 1}={2 * i + 1}>>{2 * i + 1}\n#### {2 * i + 1:,}"}
    for i in range(500, 520)
]


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def write_parquet(path, rows):
    datasets.Dataset.from_dict({k: [r[k] for r in rows] for k in rows[0]}).to_parquet(str(path))
    return str(path)


@pytest.mark.parametrize("writer,name", [(write_jsonl, "gsm.jsonl"), (write_parquet, "gsm.parquet")])
def test_file_kind_loads_jsonl_and_parquet(tmp_path, writer, name):
    path = writer(tmp_path / name, GSM_ROWS)
    train, eval_ = load_file(0, path, n_eval=4, prompt_field="question")
    assert len(train) == 16 and len(eval_) == 4
    by_q = {r["question"]: r for r in GSM_ROWS}
    for ds in (train, eval_):
        assert sorted(ds.column_names) == ["answer", "prompt", "target"]
        for p, a, t in zip(ds["prompt"], ds["answer"], ds["target"]):
            assert a == t == by_q[p]["answer"]  # the target defaults to the answer field
            assert verify_gsm8k(t, a) == 1.0
    assert not set(train["prompt"]) & set(eval_["prompt"])


def test_file_kind_explicit_format_and_eval_file(tmp_path):
    # suffixes that say nothing need format:
    tr = write_parquet(tmp_path / "train.data", GSM_ROWS[:6])
    ev = write_parquet(tmp_path / "eval.data", GSM_ROWS[6:8])
    with pytest.raises(ValueError, match="format"):
        load_file(0, tr, prompt_field="question")
    with pytest.raises(ValueError, match="format"):
        load_file(0, tr, prompt_field="question", format="csv")
    train, eval_ = load_file(0, tr, eval_path=ev, prompt_field="question", format="parquet")
    assert list(train["prompt"]) == [r["question"] for r in GSM_ROWS[:6]]  # all of it: no split
    assert list(eval_["prompt"]) == [r["question"] for r in GSM_ROWS[6:8]]


def test_file_kind_target_field_and_missing_field(tmp_path):
    rows = [{"q": f"{i}*{i}=", "a": i * i, "work": f"{i}*{i}\n{i * i}"} for i in range(10)]
    path = write_parquet(tmp_path / "sq.parquet", rows)
    train, eval_ = load_file(1, path, n_eval=3, prompt_field="q", answer_field="a", target_field="work")
    row = eval_[0]
    i = int(row["prompt"].split("*")[0])
    assert row == {"prompt": f"{i}*{i}=", "answer": str(i * i), "target": f"{i}*{i}\n{i * i}"}
    with pytest.raises(ValueError, match="missing field.*'solution'"):
        load_file(0, path, prompt_field="q", answer_field="a", target_field="solution")


def test_gsm8k_file_task_spec(tmp_path):
    write_jsonl(tmp_path / "gsm.jsonl", GSM_ROWS)
    spec = tmp_path / "gsm.yaml"
    # a relative data path is found next to the spec
    spec.write_text("kind: file\nverifier: gsm8k\nmax_new_tokens: 64\n"
                    "params: {path: gsm.jsonl, n_eval: 5, prompt_field: question}\n")
    task = load_task(str(spec), seed=0)
    assert task.name == "gsm" and len(task.eval) == 5
    row = task.eval[0]
    assert task.verify(row["target"], row["answer"]) == 1.0
    want = row["answer"].rsplit("#### ", 1)[1]  # e.g. "1,001"
    assert task.verify(f"so {want.replace(',', '')}", row["answer"]) == 1.0
    assert task.verify("#### 3", row["answer"]) == 0.0
