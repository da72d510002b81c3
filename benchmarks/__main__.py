"""``python -m benchmarks NAME [options]``: see :mod:`benchmarks.cli` and benchmarks/README.md."""

import sys

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
