"""The console commands. Every console script imports this package first, so a signal during a
command's start-up (its imports take seconds) is under the signal policy too (:func:`lra.signals.guard_startup`)."""

import os
import sys

from lra import signals

if os.path.basename(sys.argv[0] if sys.argv else "").startswith("lra-"):  # a console command's process, not a library user
    signals.guard_startup()
