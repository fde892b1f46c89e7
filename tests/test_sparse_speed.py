"""lra.benchmarks.sparse_speed end to end on a CPU, small: its rows, its table and its density."""

import json

import pytest
import torch

import attention_zoo
from lra.benchmarks import sparse_speed


def test_sparse_speed_measures_each_pattern_and_writes_its_table(tmp_path, capsys):
    out = tmp_path / "sparse.md"
    code = sparse_speed.main(["--lengths", "300", "--patterns", "longformer", "sparse_transformer",
                              "--heads", "2", "--head-dim", "8", "--repeats", "1", "--out", str(out)])
    assert code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [row["pattern"] for row in rows] == ["longformer", "sparse_transformer"]
    for row in rows:
        backend, options = sparse_speed.PATTERNS[row["pattern"]]
        module = attention_zoo.build(backend, num_heads=2, head_dim=8, max_seq_len=300, **options)
        q = torch.zeros(1, 2, 300, 8)
        dense = module.attended_keys(q, q, torch.ones(1, 300, dtype=torch.bool)).double().mean().item()
        assert abs(row["density"] - dense) < 1e-9
        assert row["pass"] == "forward" and row["density"] <= row["blocks_computed"] <= 3 * 4 * 128**2 / 300**2  # a 3 x (3 or 4) grid at most
        assert row["flex_ms"] > 0 and row["mask_build_ms"] > 0 and row["flex_vs_ideal"] > 0
    table = out.read_text()
    assert "forward on cpu, fp32" in table and "Flex ÷ (density × SDPA)" in table
    assert table.count("| longformer") == 1 and table.count("| sparse_transformer") == 1


def test_sparse_speed_refuses_a_bad_length_in_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        sparse_speed.main(["--lengths", "0"])
    assert stop.value.code == 2
    assert "--lengths 0: it must be >= 1" in capsys.readouterr().err
