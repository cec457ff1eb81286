"""The one exception type the CLI turns into a single line on stderr and exit code 1."""


class AudioparityError(Exception):
    """A user-facing failure: the message names the file, key or shape and what was expected."""
