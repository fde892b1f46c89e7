"""Errors a user can cause, each carrying the one line that names the fix."""


class UserError(Exception):
    """Bad input from the user: printed as one line (``error: …``), never as a traceback."""
