"""`python -m headspec.launch ARGS`: the launcher's command line (headspec/launch/__init__.py)."""

import sys

from headspec.launch import main

sys.exit(main(sys.argv[1:]))
