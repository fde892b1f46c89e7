"""The docs' headline numbers are the committed outputs they name: docs/results.md's table is what
lra-table prints today over the committed GPU records."""

from pathlib import Path

from lra.commands.table import main as table_main

REPO = Path(__file__).resolve().parent.parent
RESULTS_MARKER = "\n<!-- lra-table output below"


def test_the_results_page_holds_what_lra_table_prints_over_the_committed_records(tmp_path):
    records = sorted(str(folder) for folder in (REPO / "docs" / "gpu").glob("*/records"))
    assert records, "docs/gpu/<date>/records: the committed reference records are missing"
    table_main([*records, "--reference", "yoso", "--runs", "--efficiency", "--output", str(tmp_path / "table.md")])
    page = (REPO / "docs" / "results.md").read_text()
    header, marker, generated = page.partition(RESULTS_MARKER)
    assert marker and header.startswith("# "), "docs/results.md: a heading, its lead, then the marker line"
    generated = generated.split("\n", 1)[1]
    assert generated == "\n" + (tmp_path / "table.md").read_text(), (
        "docs/results.md is stale: run the regeneration command in its header")

