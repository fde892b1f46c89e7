"""Errors a user can cause, each carrying the one line that names the fix."""


class UserError(Exception):
    """Bad input from the user: printed as one line (``error: …``), never as a traceback."""

    exit_code = 1


class ConfigError(UserError):
    """A configuration value or key that no run can use (exit status 2, like a usage error)."""

    exit_code = 2


class InvalidValue(ConfigError):
    """A value the validation refuses (``invalid value for <key>: …``); its line says which value to pass
    instead, which a resume, taking no overrides, cannot (lra.commands.train.validate_saved)."""


class TrainingDiverged(UserError, FloatingPointError):
    """The training loss stopped being finite: a run of these settings cannot go on (its line names the
    settings to change); a FloatingPointError too, as it was before it had a type of its own."""
