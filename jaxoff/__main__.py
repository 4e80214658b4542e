"""``python -m jaxoff <command>``: the same as the ``jaxoff`` script."""

import sys

from .cli import main

sys.exit(main())
