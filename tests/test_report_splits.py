"""``report --by``: the "Splits compared" section (g), its ``splits_<group>.png`` and table.

The store, experiment ``splits`` (task arith, preset default, every run FINISHED, tag ``correction=none``):

- group tiny-moe: grpo and gspo x routing_replay none | r3 x seeds 0, 1, 2; each run logs eval/pass1 at steps
  0, 10, 20, 30, 40 (0.40 rising linearly to its final value), mismatch/kl and moe/routing_mismatch at steps
  1..40;
- group tiny-dense: the same algorithms and splits, seeds 0, 1, eval/pass1 and moe/routing_mismatch only (no run
  logs mismatch/kl).

Final pass@1 per seed 0 / 1 / 2 (tiny-dense: seeds 0 / 1 of the same):
grpo none .60 .50 .70 (mean .60, sd .10); gspo none .70 .60 .65 (mean .65, sd .05);
grpo r3 .30 .40 .35 (mean .35, sd .05); gspo r3 .80 .70 .75 (mean .75, sd .05).

mismatch/kl of seed s at step t: KL * (s + 1) * (0.5 at odd t, 1.5 at even t), so its mean over the 40 steps
is KL * (s + 1) and the mean over seeds 0, 1, 2 is 2 * KL. moe/routing_mismatch: RM + 0.01 s +/- 0.005
(odd/even step), mean over steps RM + 0.01 s, over seeds 0, 1, 2 RM + 0.01 (seeds 0, 1: RM + 0.005).
"""

from __future__ import annotations

import struct

import pytest

from gspo_bench.cli.main import main
from gspo_bench.reporting import figures
from gspo_bench.reporting.frame import RunData
from gspo_bench.reporting.report import write_report
from tests.mlflow_fakes import log_run, new_store

EXP = "splits"
PNG = b"\x89PNG\r\n\x1a\n"
EVAL_STEPS = (0, 10, 20, 30, 40)
FINALS = {("grpo", "none"): (0.60, 0.50, 0.70), ("gspo", "none"): (0.70, 0.60, 0.65),
          ("grpo", "r3"): (0.30, 0.40, 0.35), ("gspo", "r3"): (0.80, 0.70, 0.75)}
KL = {("grpo", "none"): 3e-5, ("gspo", "none"): 2e-5, ("grpo", "r3"): 1.5e-5, ("gspo", "r3"): 1e-5}
RM = {("grpo", "none"): 0.15, ("gspo", "none"): 0.11, ("grpo", "r3"): 0.04, ("gspo", "r3"): 0.02}


def _run(client, exp_id, model, algo, replay, seed, kl: bool):
    key = (algo, replay)
    final = FINALS[key][seed]
    extra = [("moe/routing_mismatch", s, RM[key] + 0.01 * seed + (0.005 if s % 2 else -0.005)) for s in range(1, 41)]
    if kl:
        extra += [("mismatch/kl", s, KL[key] * (seed + 1) * (0.5 if s % 2 else 1.5)) for s in range(1, 41)]
    log_run(client, exp_id, algo=algo, seed=seed, model=model, run_name=f"{algo}-{replay}-s{seed}",
            evals=[(s, 0.40 + (final - 0.40) * i / 4) for i, s in enumerate(EVAL_STEPS)],
            tags={"routing_replay": replay, "correction": "none"}, eval_reward=0.3, steps=40, clip_steps=40,
            metrics=extra)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri, client, ids = new_store(tmp_path_factory, "splits", EXP)
    exp = ids[EXP]
    for algo, replay in FINALS:
        for seed in range(3):
            _run(client, exp, "tiny-moe", algo, replay, seed, kl=True)
        for seed in range(2):
            _run(client, exp, "tiny-dense", algo, replay, seed, kl=False)
    return uri


@pytest.fixture(scope="module")
def by_report(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("by_report")
    assert main(["report", "--tracking-uri", store, "--experiment", EXP, "--by", "routing_replay",
                 "--out", str(out)]) == 0
    return out, (out / "report.md").read_text()


def _size(path) -> tuple[int, int]:
    """(width, height) of a PNG, from its IHDR chunk."""
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_splits_figures_are_pngs_one_per_group(by_report):
    out, md = by_report
    for model in ("tiny-moe", "tiny-dense"):
        path = out / f"splits_arith_{model}.png"
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, path
        assert f"](splits_arith_{model}.png)" in md
    # tiny-moe draws three metric rows, tiny-dense two; both two algorithm columns
    (w_moe, h_moe), (w_dense, h_dense) = (_size(out / f"splits_arith_{m}.png") for m in ("tiny-moe", "tiny-dense"))
    assert h_moe > h_dense and abs(w_moe - w_dense) < 0.2 * w_moe
    assert md.count("## Splits compared: ") == 2


def test_splits_section_follows_the_groups_splits(by_report):
    _, md = by_report
    order = ["## arith / tiny-dense / routing_replay=none\n", "## arith / tiny-dense / routing_replay=r3\n",
             "## Splits compared: arith / tiny-dense\n", "## arith / tiny-moe / routing_replay=none\n",
             "## arith / tiny-moe / routing_replay=r3\n", "## Splits compared: arith / tiny-moe\n"]
    assert [md.index(h) for h in order] == sorted(md.index(h) for h in order)


def test_splits_table_has_hand_computed_means(by_report):
    _, md = by_report
    moe = md[md.index("## Splits compared: arith / tiny-moe"):]
    assert "| algo | routing_replay | seeds | final pass@1 | mean mismatch/kl | mean routing mismatch |" in moe
    # final pass@1 mean ± sd over seeds; mismatch/kl 2 * KL; routing mismatch RM + 0.01
    assert "| gspo | r3 | 3 (0,1,2) | 0.750 ± 0.050 | 2e-05 | 0.03 |" in moe
    assert "| gspo | none | 3 (0,1,2) | 0.650 ± 0.050 | 4e-05 | 0.12 |" in moe
    assert "| grpo | none | 3 (0,1,2) | 0.600 ± 0.100 | 6e-05 | 0.16 |" in moe
    assert "| grpo | r3 | 3 (0,1,2) | 0.350 ± 0.050 | 3e-05 | 0.05 |" in moe
    assert moe.index("| grpo | none |") < moe.index("| gspo | none |")  # algorithms in registry order
    assert "n = 3 seeds per line" in moe and "min..max over those seeds" in moe
    assert "A row per metric (`eval/pass1`, `mismatch/kl`, `moe/routing_mismatch`)" in moe
    assert "Not logged by any run of the group: `moe/expert_flip_rate`." in moe


def test_group_without_mismatch_kl_gets_the_present_metrics_only(by_report):
    _, md = by_report
    dense = md[md.index("## Splits compared: arith / tiny-dense"):md.index("## arith / tiny-moe")]
    assert "A row per metric (`eval/pass1`, `moe/routing_mismatch`)" in dense
    assert "Not logged by any run of the group: `mismatch/kl`, `moe/expert_flip_rate`." in dense
    assert "n = 2 seeds per line" in dense
    # seeds 0, 1: gspo r3 finals .80, .70 (mean .75, sd sqrt(.005) = .0707); routing mismatch .02 + .005
    assert "| gspo | r3 | 2 (0,1) | 0.750 ± 0.071 | - | 0.025 |" in dense
    assert "| grpo | none | 2 (0,1) | 0.550 ± 0.071 | - | 0.155 |" in dense


def test_without_by_there_is_no_splits_section(store, tmp_path):
    rep = write_report(store, EXP, tmp_path / "plain", log_to_mlflow=False)
    md = rep.path.read_text()
    assert "Splits compared" not in md and "## arith / tiny-moe\n" in md
    assert not list((tmp_path / "plain").glob("splits_*")) and not any("splits_" in f.name for f in rep.figures)


def test_two_tags_label_each_line_with_both_values(store, tmp_path, monkeypatch):
    seen = []
    draw = figures.plot_splits

    def spy(splits, metrics, path, title):
        seen.append((path.name, list(splits), list(metrics)))
        return draw(splits, metrics, path, title)

    monkeypatch.setattr(figures, "plot_splits", spy)
    rep = write_report(store, EXP, tmp_path / "two", by=("routing_replay", "correction"), log_to_mlflow=False)
    labels = ["routing_replay=none, correction=none", "routing_replay=r3, correction=none"]
    assert seen == [("splits_arith_tiny-dense.png", labels, ["eval/pass1", "moe/routing_mismatch"]),
                    ("splits_arith_tiny-moe.png", labels, ["eval/pass1", "mismatch/kl", "moe/routing_mismatch"])]
    md = rep.path.read_text()
    assert "| algo | routing_replay | correction | seeds | final pass@1 |" in md
    assert "| gspo | r3 | none | 3 (0,1,2) | 0.750 ± 0.050 | 2e-05 | 0.03 |" in md
    assert {p.name for p in rep.figures} >= {"splits_arith_tiny-dense.png", "splits_arith_tiny-moe.png"}


def test_log_axis_curve_leaves_out_non_positive_values():
    runs = [RunData(str(i), "FINISHED", {"algo": "gspo", "seed": str(i)}, {}, {},
                    history={"mismatch/kl": [(1, 0.0), (2, v), (3, -1.0)]}) for i, v in enumerate((1e-5, 3e-5))]
    steps, mean, lo, hi = figures.curve(runs, "mismatch/kl", positive=True)
    assert list(steps) == [2] and mean[0] == pytest.approx(2e-5) and (lo[0], hi[0]) == (1e-5, 3e-5)
    assert list(figures.curve(runs, "mismatch/kl")[0]) == [1, 2, 3]  # unchanged without positive
    assert figures.curve(runs[:1], "mismatch/kl", positive=True)[0].tolist() == [2]
