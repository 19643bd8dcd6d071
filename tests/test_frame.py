"""The long runs table's text (``frame.csv_text``): the same as pandas writes it, whatever its cells hold."""

from __future__ import annotations

import gzip
import math

import pandas as pd
from hypothesis import given, settings, strategies as st

from gspo_bench.reporting.frame import csv_text, write_frame
from tests.conftest import examples

# cells that test CSV's rules: separators, quotes, line breaks, blanks, numbers that look like text
CELL = st.one_of(st.none(), st.sampled_from(["", "a", "a,b", 'say "x"', "line\nbreak", "1e-05", " pad ", "é"]),
                 st.text(max_size=4))


@st.composite
def long_tables(draw):
    runs = draw(st.integers(1, 4))
    columns = draw(st.permutations(["run_id", "metric", "tags.a", "step", "params.b", "value", "tags.c"]))
    rows = []
    heads = {r: {"run_id": f"r{r}", "tags.a": draw(CELL), "params.b": draw(CELL), "tags.c": draw(CELL)}
             for r in range(runs)}
    for _ in range(draw(st.integers(1, 12))):  # the runs' rows interleaved
        r = draw(st.integers(0, runs - 1))
        rows.append({**heads[r], "metric": draw(CELL), "step": draw(st.integers(-1, 50)),
                     "value": draw(st.one_of(st.floats(allow_nan=True, allow_infinity=False), st.just(0.1)))})
    return pd.DataFrame(rows)[columns]


@settings(max_examples=examples(60), deadline=None)
@given(long_tables())
def test_the_text_is_pandas_own(frame):
    assert csv_text(frame) == frame.to_csv(index=False)


def test_a_tail_column_alone_between_others_keeps_its_blank_cells_blank():
    # one column written alone would come out as "" for a blank: joined into a row it must stay empty
    frame = pd.DataFrame({"run_id": ["r", "r", "s"], "metric": [None, "m", ""], "tags.a": ["x", "x", None],
                          "step": [1, 2, 3], "params.b": [None, None, "y,z"], "value": [math.nan, 0.5, 1e300]})
    text = csv_text(frame)
    assert text == frame.to_csv(index=False)
    assert text.splitlines()[1] == "r,,x,1,,"


def test_write_frame_writes_that_text_compressed_with_infinities_as_the_largest_float(tmp_path):
    frame = pd.DataFrame({"run_id": ["r", "r"], "status": ["FINISHED"] * 2, "experiment": ["e"] * 2,
                          "artifact_uri": ["", ""], "tags.algo": ["gspo"] * 2, "metric": ["train/loss"] * 2,
                          "step": [1, 2], "value": [math.inf, -1.5]})
    path = write_frame(frame, tmp_path / "runs.csv.gz")
    text = gzip.decompress(path.read_bytes()).decode()
    assert text.splitlines()[1:] == ["r,FINISHED,e,,gspo,train/loss,1,1.7976931348623157e+308",
                                     "r,FINISHED,e,,gspo,train/loss,2,-1.5"]
