"""User-facing errors: the binaries print them as one line and exit non-zero."""


class UserError(Exception):
    """Bad input the user can fix: the message says what is wrong and what to do."""
