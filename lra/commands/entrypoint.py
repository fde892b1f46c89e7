"""The Docker image's entry point: ``docker run IMAGE <arguments>``.

Arguments that start with a command (``lra-prepare text …``, ``lra-table …``, ``python …``, ``bash``)
run that command; anything else (``task=listops attention=yoso``, ``-m …``, ``--help``, nothing at
all) is handed to ``lra-train``, so the image's original usage keeps working.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import List

DEFAULT_COMMAND = "lra-train"


def command_line(arguments: List[str]) -> List[str]:
    """The command to run for ``docker run IMAGE *arguments``."""
    first = arguments[0] if arguments else ""
    if not first or first.startswith("-") or "=" in first:  # Hydra overrides and flags
        return [DEFAULT_COMMAND, *arguments]
    return list(arguments)


def main(argv=None) -> None:
    command = command_line(sys.argv[1:] if argv is None else argv)
    if shutil.which(command[0]) is None:
        sys.exit(f"error: no command '{command[0]}' in this image; run lra-train, lra-prepare, lra-table, "
                 f"lra-profile, lra-fidelity or lra-sync, or pass lra-train's key=value overrides alone")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
