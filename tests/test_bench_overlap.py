"""``bench --async`` (gspo_bench.bench.overlap): the synchronous loop against asynchronous rollouts, measured."""

from __future__ import annotations

import pytest

from gspo_bench.bench import overlap


def test_bench_async_times_each_k_and_models_a_sampler_of_its_own(mixed_task, tmp_path):
    lines = []
    res = overlap.async_benchmark("smoke", (), {"task": mixed_task, "warmstart": {"enabled": False},
                                               "train": {"steps": 3, "eval_every": 3}}, ks=(0, 1), log=lines.append,
                                  partial=True)
    sync, k1, k1p = res["rows"]
    assert [(r["k"], r["partial"]) for r in res["rows"]] == [(0, False), (1, False), (1, True)]
    assert all(r["status"] == "FINISHED" for r in res["rows"])
    assert k1["partial_frac"] == 0.0 and 0.0 <= k1p["partial_frac"] <= 1.0 and 0.0 < k1p["staleness"] <= 1.0
    assert sync["speedup"] == pytest.approx(1.0) and sync["overlap"] == 0.0 and sync["staleness"] == 0.0
    # K = 1: the worker sampled the second step's rollout while the first trained
    assert 0.0 < k1["staleness"] <= 1.0 and 0.0 <= k1["overlap"] <= 1.0
    assert all(r["steps_per_hour"] == pytest.approx(3 / r["seconds"] * 3600) for r in res["rows"])
    # the model: (g + t) / max(g, t), from the synchronous run's own per-step times
    m = res["model"]
    assert m["gen_s"] == pytest.approx(sync["gen_s"])
    assert m["train_s"] == pytest.approx(sync["train_s"] + sync["eval_s"])
    assert m["predicted_speedup"] == pytest.approx((m["gen_s"] + m["train_s"]) / max(m["gen_s"], m["train_s"]))
    page = overlap.markdown(res, "python -m gspo_bench bench --async 0,1 --preset smoke", "abc1234")
    assert "at commit `abc1234`" in page and "| 0 | no | FINISHED |" in page and "| 1 | yes | FINISHED |" in page


@pytest.mark.parametrize("argv, says", [
    (["bench", "--async", "0,-1"], "--async takes whole numbers K >= 0 (0: the synchronous loop); got 0,-1"),
    (["bench", "--async", "1,x"], "--async takes whole numbers K >= 0, comma-separated; got 1,x"),
    (["bench", "--async", "1", "--whole"], "--whole and --async each ask for a measurement of their own"),
    (["bench", "--async", "1", "--set", "rollout.stale_policy=later"], "rollout.stale_policy"),
    (["bench", "--async", "0", "--partial"], "--partial measures partial rollouts at each K > 0; --async 0 has none"),
    (["bench", "--async", "0,1", "--partial", "--set", "rollout.engine=hf"], "engine hf cannot continue a response"),
])
def test_bad_async_flags_end_in_one_line_and_exit_2_before_any_work(argv, says, capsys, monkeypatch):
    from gspo_bench.bench import overlap as bench_overlap
    from gspo_bench.cli.main import main

    monkeypatch.setattr(bench_overlap, "async_benchmark", lambda *a, **k: pytest.fail("work started"))
    code = main(argv)
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2 and says in text and len(text.splitlines()) == 1, text
