"""`python -m headspec <command> ...`"""

from headspec.cli import run

run()
