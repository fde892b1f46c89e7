"""Errors a user can cause, each carrying the one line that names the fix."""


class UserError(Exception):
    """Bad input from the user: printed as one line (``error: …``), never as a traceback."""

    exit_code = 1


class ConfigError(UserError):
    """A configuration value or key that no run can use (exit status 2, like a usage error)."""

    exit_code = 2
