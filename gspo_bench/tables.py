"""Tables as text: Markdown for every results file and report, CSV through pandas.

One renderer, so every table the project writes has the same shape: a header
row, a ``---`` rule, one row per record, ``|`` inside a cell escaped. Cells
are given as text (each caller formats its own numbers). ``csv_text`` keeps
raw values (None as an empty cell) and is pandas' ``to_csv``.
"""

from __future__ import annotations


def markdown(columns, rows) -> str:
    """A GitHub Markdown table of ``rows`` (sequences of cell texts, one per column), ending in a newline."""
    def cell(x) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(str, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def csv_text(columns, records) -> str:
    """CSV of ``records`` (dicts) restricted to ``columns``, in that order; a missing or None value is an empty
    cell."""
    import pandas as pd

    # object columns: a count stays 3, not 3.0, beside an empty cell
    frame = pd.DataFrame([{c: r.get(c) for c in columns} for r in records], columns=list(columns), dtype=object)
    return frame.to_csv(index=False, lineterminator="\n")
