"""MkDocs hook: links from docs/ to the rest of the repository become repository paths in the site.

The pages link to files outside docs/ (``../results/bench.md``, ``../gspo_bench/core/losses.py``) so that they
can be followed where the repository is read (GitHub, an editor; tests/test_docs.py checks each resolves). The
site holds docs/ only, so there such a link would point nowhere. This hook turns each one into the file's path
in the repository, as a code span (``[`losses.py`](../gspo_bench/core/losses.py)`` becomes
```gspo_bench/core/losses.py```, ``[screenshots](../results/mlflow-ui.md)`` becomes
``screenshots (`results/mlflow-ui.md`)``). A link outside docs/ to a path that does not exist is left alone,
so ``mkdocs build --strict`` still fails on it; links inside docs/ are MkDocs' own to check.
"""

from __future__ import annotations

import re
from pathlib import Path

# the same link pattern as tests/test_docs.py: [text](target) with an optional title
LINK = re.compile(r"\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _outside_link(match: re.Match, page_dir: Path, docs_dir: Path, root: Path) -> str:
    text, target = match.group(1), match.group(2)
    if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
        return match.group(0)
    resolved = (page_dir / target.split("#", 1)[0]).resolve()
    if resolved.is_relative_to(docs_dir) or not resolved.is_relative_to(root) or not resolved.exists():
        return match.group(0)
    rel = resolved.relative_to(root).as_posix() + ("/" if resolved.is_dir() else "")
    shown = text.strip()
    inner = shown.strip("`").rstrip("/")
    if shown.startswith("`") and shown.endswith("`") and inner and rel.rstrip("/").endswith(inner):
        return f"`{rel}`"  # the text names the file: show its whole path instead
    return f"{text} (`{rel}`)"


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    page_dir = (docs_dir / page.file.src_path).parent

    def rewrite(chunk: str) -> str:
        return LINK.sub(lambda m: _outside_link(m, page_dir, docs_dir, root), chunk)

    # fenced code blocks are left as they are; the text between them is rewritten
    out, last = [], 0
    for fence in FENCE.finditer(markdown):
        out += [rewrite(markdown[last:fence.start()]), fence.group(0)]
        last = fence.end()
    out.append(rewrite(markdown[last:]))
    return "".join(out)
