"""`python -m headspec <command> ...`"""

from headspec.cli.main import run

run()
