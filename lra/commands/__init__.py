"""The console commands. Every console script imports this package first, so a signal during a
command's start-up (its imports take seconds) is under the signal policy too (:func:`lra.signals.guard_startup`),
and a standard output or error closed at start (``>&-``) is never a file the command opens
(:func:`lra.commands.streams.keep_descriptors_open`)."""

import os
import sys

from lra import signals

if os.path.basename(sys.argv[0] if sys.argv else "").startswith("lra-"):  # a console command's process, not a library user
    signals.guard_startup()
    from lra.commands import streams

    streams.keep_descriptors_open()
