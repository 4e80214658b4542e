"""Thin entry point: `python bench/io_bench.py [--help]` == `jaxoff io-bench`."""

import sys

from jaxoff._iobench import main

if __name__ == "__main__":
    sys.exit(main())
