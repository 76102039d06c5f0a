"""``python -m daskvec.bench``: the same as ``daskvec bench``."""

import sys

from daskvec.bench.command import main

if __name__ == "__main__":
    sys.exit(main())
