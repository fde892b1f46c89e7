"""``lra-table DIR...``: aggregate run records into a comparison table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lra.results.table import collect, comparison, status_counts, to_markdown


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="lra-table", description=__doc__.split("\n")[0].strip("`"))
    parser.add_argument("directories", nargs="+", type=Path, help="run or sweep directories")
    parser.add_argument("--format", choices=["markdown", "csv", "json"], default="markdown")
    parser.add_argument("--metric", default="test_accuracy", help="metrics.json field to tabulate")
    parser.add_argument("--output", type=Path, help="write here instead of standard output")
    args = parser.parse_args(argv)
    missing = [d for d in args.directories if not d.is_dir()]
    if missing:
        parser.exit(2, f"error: no such directory: {', '.join(map(str, missing))}; pass run or sweep folders under runs/\n")
    runs = collect(args.directories)
    table = comparison(runs, args.metric)
    text = {"markdown": lambda: to_markdown(table) + f"\n\nruns: {status_counts(runs)}",
            "csv": lambda: table.to_csv(), "json": lambda: table.to_json(orient="index", indent=2)}[args.format]()
    if args.output:
        args.output.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
