"""The README's algorithm table and set-up commands agree with the code."""

from __future__ import annotations

from pathlib import Path

from gspo_bench.core.losses import LOSSES

README = Path(__file__).resolve().parents[1] / "README.md"


def _table_rows() -> list[list[str]]:
    text = README.read_text()
    body = text.split("<!-- algorithms-table:start -->")[1].split("<!-- algorithms-table:end -->")[0]
    lines = [ln.strip() for ln in body.strip().splitlines()][2:]  # skip header and separator
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_algorithm_table_matches_registry():
    rows = _table_rows()
    assert [r[0].strip("`") for r in rows] == list(LOSSES)
    for (name, ratio, loss, agg, clip, paper) in rows:
        spec = LOSSES[name.strip("`")]
        assert ratio == spec.ratio
        assert loss.strip("`") == spec.loss
        assert agg == spec.aggregation
        assert clip == f"{spec.eps_low} / {spec.eps_high}"
        assert paper == spec.paper


def test_readme_opens_with_the_two_setup_commands():
    blocks = README.read_text().split("```bash")[1:3]
    first, second = (b.split("```")[0].strip() for b in blocks)
    assert "torch==2.13.0" in first and first.endswith("python -m gspo_bench run --algos all")
    assert "torch==2.13.0" in second and '".[test]"' in second and second.endswith("python -m pytest -q")
