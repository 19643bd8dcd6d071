"""``bench --suite-ray`` (``bench/suite_ray.py``): the speed-up and the overhead per cell from hand-made timings, the
page naming its command and commit, and bad input as one line with exit 2 before anything runs. (The Ray head it
starts is the one tests/test_suite_ray.py runs its cluster on.)"""

from __future__ import annotations

import pytest

from gspo_bench.bench import suite_ray
from gspo_bench.cli.main import main


def _run(wall: float, cell_s: float, suite_s: float | None = None) -> dict:
    return {"exit_code": 0, "wall_s": wall, "suite_s": suite_s or wall - 5, "cells": 4, "finished": 4,
            "cell_s": cell_s, "workers": 1, "log_tail": ""}


RESULT = {"workers": 2, "repeats": 3, "sets": [], "cluster_start_s": 6.0, "warm_up": _run(60, 20),
          "runs": {"local": [_run(40, 20), _run(44, 21), _run(42, 20)],
                   "ray": [_run(30, 22), _run(24, 22), _run(25, 23)]}}


def test_medians_speed_up_and_overhead_per_cell():
    s = suite_ray.summary(RESULT)
    assert s["local"]["wall_s"] == 42 and s["ray"]["wall_s"] == 25 and s["ray"]["cell_s"] == 22
    assert s["ray"]["speedup"] == pytest.approx(42 / 25) and s["local"]["speedup"] == 1
    # (workers x wall - training) / cells: serial (1 x 42 - 20) / 4, Ray (2 x 25 - 22) / 4
    assert s["local"]["overhead_s"] == pytest.approx(5.5) and s["ray"]["overhead_s"] == pytest.approx(7.0)
    assert suite_ray.ok(RESULT)
    failed = {**RESULT, "runs": {**RESULT["runs"], "ray": [{**_run(30, 0), "finished": 3}]}}
    assert not suite_ray.ok(failed)


def test_the_page_names_its_command_commit_and_the_suite_it_timed():
    page = suite_ray.markdown(RESULT, "python -m gspo_bench bench --suite-ray", "abc1234", "2-core CPU")
    assert "Made by `python -m gspo_bench bench --suite-ray` at commit `abc1234`, on 2-core CPU." in page
    assert "suite --scenarios smoke --algos grpo,gspo --seeds 2 --set train.steps=2" in page
    assert "| ray | 2 | 3 | 25.0 | 20.0 | 22.0 | 1.68x | 7.0 |" in page
    assert "| local | 1 | 3 | 42.0 | 37.0 | 20.0 | 1.00x | 5.5 |" in page


@pytest.mark.parametrize("extra, needle", [(["--workers", "0"], "--workers 0"),
                                          (["--preset", "smoke"], "--preset, --config, --model and --task do not"),
                                          (["--set", "train.nope=1"], "train.nope")])
def test_bad_input_is_one_line_exit_2(extra, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--suite-ray", *extra]) == 2
    text = capsys.readouterr().out.strip()
    assert needle in text and "error" in text and len(text.splitlines()) == 1, text
    assert list(tmp_path.iterdir()) == []
