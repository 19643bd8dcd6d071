"""``python -m gspo_bench``: the command line (``cli/main.py``)."""

import sys

from gspo_bench.cli.pages import prefer_huge_pages

# before anything imports torch, which reads it once (cli/pages.py)
prefer_huge_pages()

from gspo_bench.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
