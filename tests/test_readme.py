"""The README's algorithm table (repeated on docs/index.md) and set-up commands agree with the code."""

from __future__ import annotations

from pathlib import Path

from gspo_bench.core.losses import LOSSES

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS_INDEX = README.parent / "docs" / "index.md"  # the site's front page repeats the table


def _table_rows() -> list[list[str]]:
    text = README.read_text()
    body = text.split("<!-- algorithms-table:start -->")[1].split("<!-- algorithms-table:end -->")[0]
    lines = [ln.strip() for ln in body.strip().splitlines()][2:]  # skip header and separator
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def table_markdown() -> str:
    """The algorithms table as the README holds it, from the registry (paste its output between the markers)."""
    head = ["| algo | ratio unit | per-unit loss | aggregation | defaults (eps_low / eps_high; own) | paper |",
            "|---|---|---|---|---|---|"]
    return "\n".join(head + [f"| `{s.name}` | {s.ratio} | `{s.loss}` | {s.aggregation} | {s.defaults_text()} | "
                             f"{s.paper} |" for s in LOSSES.values()])


def test_algorithm_table_matches_registry():
    rows = _table_rows()
    assert [r[0].strip("`") for r in rows] == list(LOSSES)
    for (name, ratio, loss, agg, defaults, paper) in rows:
        spec = LOSSES[name.strip("`")]
        assert ratio == spec.ratio
        assert loss.strip("`") == spec.loss
        assert agg == spec.aggregation
        assert defaults == spec.defaults_text()
        assert paper == spec.paper
    for page in (README, DOCS_INDEX):
        assert table_markdown() in page.read_text(), \
            f"regenerate in {page.name}: python -c 'from tests.test_readme import table_markdown as t; print(t())'"


def test_readme_opens_with_the_two_setup_commands():
    blocks = README.read_text().split("```bash")[1:3]
    first, second = (b.split("```")[0].strip() for b in blocks)
    assert "torch==2.13.0" in first and first.endswith("python -m gspo_bench run --algos all")
    assert "torch==2.13.0" in second and '".[test]"' in second and second.endswith("python -m pytest -q")
