"""``python -m gspo_bench``: the command line (``cli/main.py``)."""

import sys

from gspo_bench.cli.pages import prefer_huge_pages

# before anything imports torch, which reads it once (cli/pages.py)
prefer_huge_pages(argv=sys.argv[1:])

from gspo_bench.cli.main import main  # noqa: E402


def entry() -> int:
    """The ``gspo-bench`` script: the same command line, with the same huge-pages preference."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
