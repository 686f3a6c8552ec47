"""The command line: main (`headspec <command>`: absl flags, ml_collections configs, one line per user error),
commands (the one table of commands, handlers named "module:function"), config_help (the `--help` of a
command's keys), quickstart, stage (a resumable pipeline stage). Sits on top of everything.
"""
