"""The docs' headline numbers are the committed outputs they name: docs/results.md's table is what
lra-table prints today over the committed GPU records, and docs/benchmarks.md's GPU table is the H100
kernel benchmark it cites, cell for cell."""

import re
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



def kernel_benchmark(path: Path) -> dict[tuple[str, int], str]:
    """(cell, n) -> forward + backward ms as yoso_speed wrote its Markdown rows ("out of memory" where it ran out)."""
    cells = {}
    for line in path.read_text().splitlines():
        parts = [part.strip() for part in line.strip().strip("|").split("|")]
        if len(parts) == 6 and parts[2].isdigit():
            cells[parts[0], int(parts[2])] = parts[4] or parts[3]
    return cells


def test_the_gpu_headline_table_is_the_kernel_benchmark_it_cites():
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    section = docs[docs.index("### YOSO against softmax and FlashAttention on an H100"):]
    section = section[:section.index("\n#")]
    source = re.search(r"\]\((gpu/[^)]+/kernels\.md)\)", section)
    assert source, "the headline GPU table names the kernels.md it comes from"
    measured = kernel_benchmark(REPO / "docs" / source.group(1))
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| n |"))
    table = lines[start:lines.index("", start)]
    columns = [column.strip() for column in table[0].strip("|").split("|")][1:]
    assert {"softmax (eager)", "softmax (SDPA, bf16)", "YOSO-32", "YOSO-32 (CUDA graphs)"} <= set(columns)
    rows = [[value.strip() for value in row.strip("|").split("|")] for row in table[2:]]
    assert [row[0] for row in rows] == ["4,096", "8,192", "16,384", "32,768"]
    for n, *values in rows:
        for column, value in zip(columns, values, strict=True):
            assert value == measured[column, int(n.replace(",", ""))], (column, n, value)
