"""``lra-sync DIR...``: upload the offline W&B runs of run or sweep directories (``wandb sync``).

Offline runs live in each run's folder (``runs/…/<job>/wandb/offline-run-*``), not in ``./wandb``,
so a plain ``wandb sync`` from the project root finds nothing; this finds them all under the given
folders and hands them to ``wandb sync`` in one call. A run synced again continues the same W&B run
(the run id is derived from the run folder).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable, List

from lra.commands.config_errors import at_the_edge


def offline_runs(directories: Iterable[Path]) -> List[Path]:
    found = set()
    for directory in directories:
        found.update(p for p in Path(directory).rglob("offline-run-*") if p.is_dir() and p.parent.name == "wandb")
    return sorted(found)


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="lra-sync", description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("directories", nargs="+", type=Path, help="run or sweep folders (e.g. runs/multirun/<date>/<time>)")
    parser.add_argument("--dry-run", action="store_true", help="print the wandb sync command, run nothing")
    args, wandb_options = parser.parse_known_args(argv)  # the rest goes to wandb sync (e.g. --project P)
    missing = [str(d) for d in args.directories if not d.is_dir()]
    if missing:
        parser.exit(2, f"error: no such directory: {', '.join(missing)}; pass run or sweep folders under runs/\n")
    runs = offline_runs(args.directories)
    if not runs:
        parser.exit(1, f"error: no offline W&B runs (wandb/offline-run-*) under {', '.join(map(str, args.directories))}; "
                       "runs log to W&B offline with logger=wandb when not logged in (or with WANDB_MODE=offline)\n")
    command = ["wandb", "sync", *wandb_options, *map(str, runs)]
    print(f"{len(runs)} offline run(s): {' '.join(command)}")
    if args.dry_run:
        return
    if shutil.which("wandb") is None:
        parser.exit(1, "error: the wandb command is not on PATH; install wandb (pip install wandb)\n")
    sys.exit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
