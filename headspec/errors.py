"""The one exception type for mistakes a user can make (bad input, bad config, bad paths)."""


class UserError(ValueError):
  """A user-caused error: the CLI prints its one-line message to stderr and exits non-zero."""
