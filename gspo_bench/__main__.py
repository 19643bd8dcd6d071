"""``python -m gspo_bench``: the command line (``cli/main.py``)."""

import sys

from gspo_bench.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
