"""lra-fidelity: the measures against brute force and closed forms, the limits where an
approximation must equal softmax, YOSO-m converging to YOSO-E, and the command end to end on a
trained checkpoint."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch

import attention_zoo
from conftest import SMALL_LISTOPS, run_command
from lra.fidelity import measures, report, sections
from lra.fidelity.inputs import AttentionInputs, random_inputs

CPU = torch.device("cpu")


def padded_inputs(batch=2, heads=2, n=12, d=3, seed=0) -> AttentionInputs:
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, d, generator=generator) for _ in range(3))
    mask = torch.ones(batch, n, dtype=torch.bool)
    mask[1, n - 4:] = False
    return AttentionInputs("random", seed, 2 * q, 2 * k, v, mask)


def test_value_aware_1_is_the_nearest_value_by_brute_force():
    inputs = padded_inputs()
    exact, _ = measures.exact_attention(inputs.q, inputs.k, inputs.v, inputs.mask)
    nearest = measures.nearest_value(exact, inputs.v, inputs.mask)
    o, v, mask = exact.numpy(), inputs.v.double().numpy(), inputs.mask.numpy()
    brute = np.zeros_like(o)
    for b, h, i in itertools.product(range(o.shape[0]), range(o.shape[1]), range(o.shape[2])):
        candidates = [(np.linalg.norm(v[b, h, j] - o[b, h, i]), j) for j in range(o.shape[2]) if mask[b, j]]
        brute[b, h, i] = v[b, h, min(candidates)[1]]
    np.testing.assert_array_equal(nearest.numpy(), brute)
    rows = sections.oracle_rows(inputs, budgets=[1], sampled_queries=4, seed=0)
    (aware_1,) = [r for r in rows if r["oracle"] == "v-aware" and r["r"] == 1]
    real = np.broadcast_to(mask[:, None, :], o.shape[:3])
    expected = np.linalg.norm(brute[real] - o[real]) / np.linalg.norm(o[real])
    assert math.isclose(aware_1["relative_error"], expected, rel_tol=1e-12)


@pytest.mark.parametrize("n,d", [(9, 3), (40, 4), (300, 16)])
def test_caratheodory_keeps_the_point_with_at_most_d_plus_1_values(n, d):
    generator = torch.Generator().manual_seed(n)
    values = torch.randn(6, n, d, generator=generator, dtype=torch.float64)
    values[:, 1] = values[:, 0]  # repeated values make some blocks singular
    weights = torch.softmax(3 * torch.randn(6, n, generator=generator, dtype=torch.float64), dim=-1)
    reduced = measures.caratheodory(weights, values)
    assert ((reduced > 0).sum(-1) <= d + 1).all() and (reduced >= 0).all()
    torch.testing.assert_close(reduced.sum(-1), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-12)
    point, kept = (torch.einsum("rn,rnd->rd", w, values) for w in (weights, reduced))
    torch.testing.assert_close(kept, point, rtol=0, atol=1e-12)


def test_oracles_v_aware_d_plus_1_is_zero_and_v_oblivious_at_full_budget_is_exact():
    inputs = padded_inputs(n=40, d=4)
    rows = {(r["oracle"], r["r"]): r for r in sections.oracle_rows(inputs, [1, 3, 40], sampled_queries=50, seed=0)}
    assert rows[("v-aware", 5)]["relative_error"] < 1e-12 and rows[("v-aware", 5)]["max_support"] <= 5
    assert rows[("v-oblivious", 40)]["relative_error"] < 1e-12 and rows[("v-oblivious", 40)]["mean_angle"] < 1e-7
    assert rows[("v-oblivious", 1)]["relative_error"] > rows[("v-oblivious", 3)]["relative_error"] > 0.01


def test_keep_top_keeps_the_r_largest_weights_renormalized():
    attention = torch.tensor([[0.1, 0.4, 0.2, 0.3]], dtype=torch.float64)
    torch.testing.assert_close(measures.keep_top(attention, 2), torch.tensor([[0, 4 / 7, 0, 3 / 7]], dtype=torch.float64))


def test_output_error_closed_forms():
    exact = torch.tensor([[[[1.0, 0.0], [0.0, 2.0]]]])
    rotated = torch.tensor([[[[1.0, 1.0], [0.0, 2.0]]]])  # first row 45°, second exact
    mask = torch.ones(1, 2, dtype=torch.bool)
    error = measures.output_error(rotated, exact, mask)
    assert math.isclose(error["mean_angle"], math.pi / 8, rel_tol=1e-12)
    assert math.isclose(error["relative_error"], 1 / math.sqrt(5), rel_tol=1e-12)
    assert measures.output_error(torch.zeros_like(exact), exact, mask)["mean_angle"] == pytest.approx(math.pi / 2)


def test_utility_and_bucket_balance_closed_forms():
    attention = torch.tensor([[[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]]], dtype=torch.float64)
    attended = torch.tensor([[[[1, 1, 0], [0, 0, 1], [1, 0, 0]]]], dtype=torch.bool)
    mask = torch.tensor([[True, True, False]])  # the third query is padding
    assert measures.attention_utility(attention, attended, mask) == pytest.approx(
        {"utility": 0.8, "keys_per_query": 1.5, "uncovered_queries": 0.0})
    attended[0, 0, 1] = False  # the second (real) query now attends to nothing
    assert measures.attention_utility(attention, attended, mask) == pytest.approx(
        {"utility": 0.4, "keys_per_query": 1.0, "uncovered_queries": 0.5})
    balance = measures.bucket_balance(torch.tensor([[6, 2, 0, 0]]), torch.tensor([[2, 2, 4, 0]]))
    assert balance == pytest.approx({"query_max_over_mean": 3.0, "key_max_over_mean": 2.0, "skewed_bucket_share": 2 / 3})


SPARSE_EXACT = {"longformer": {"window_size": 6, "num_global_tokens": 2}, "lsh": {"num_buckets": 4},
                "reformer": {"num_hashes": 1, "chunk_size": 4}}


@pytest.mark.parametrize("name", sorted(SPARSE_EXACT))
def test_attended_keys_are_exactly_the_keys_the_output_attends(name):
    """With one hashing round, the output is softmax restricted to ``attended_keys``."""
    inputs = padded_inputs(n=16, d=8)
    backend = sections.build_backend(name, inputs, SPARSE_EXACT[name], seed=1)
    keys = torch.nn.functional.normalize(inputs.q, dim=-1) if getattr(backend, "shared_qk", False) else inputs.k
    attended = backend.attended_keys(inputs.q, inputs.k, inputs.mask)
    scale = 1.0 if name == "reformer" else 1 / math.sqrt(8)  # the reference Reformer: q·k̂, no 1/√d
    scores = (inputs.q.double() @ keys.double().transpose(-1, -2)) * scale
    expected = torch.softmax(scores.masked_fill(~attended, float("-inf")), dim=-1).nan_to_num(0) @ inputs.v.double()
    with torch.no_grad():
        output = backend(inputs.q, inputs.k, inputs.v, inputs.mask).double()
    real = inputs.mask[:, None, :, None].expand_as(output)
    torch.testing.assert_close(output[real], expected[real], rtol=1e-4, atol=1e-5)
    if hasattr(backend, "bucket_counts"):
        query_counts, key_counts = backend.bucket_counts(inputs.q, inputs.k, inputs.mask)
        real_tokens = inputs.mask.sum(-1)[:, None, None].expand(query_counts.shape[:3])
        assert (query_counts.sum(-1) == real_tokens).all() and (key_counts.sum(-1) == real_tokens).all()


def test_nystrom_with_as_many_landmarks_as_tokens_has_error_zero_once_its_pseudo_inverse_converges():
    inputs = random_inputs(1, 2, 64, 16, 1.0, seed=0, device=CPU)

    def error(iterations):
        options = {"nystrom": {"num_landmarks": 64, "conv_kernel_size": 0, "pinv_iterations": iterations}}
        (row,) = sections.backend_rows(inputs, ["nystrom"], options, seed=0)
        return row

    errors = [error(iterations)["relative_error"] for iterations in (6, 10, 20)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-4 and error(20)["mean_angle"] < 1e-4, errors
    (softmax,) = sections.backend_rows(inputs, ["softmax"], {}, seed=0)
    assert softmax["relative_error"] < 1e-6 and softmax["mean_angle"] < 1e-6


def test_yoso_m_approaches_yoso_e_as_m_grows_and_the_angle_grows_at_most_logarithmically_in_n():
    rows = []
    for n, seed in itertools.product([64, 256, 1024], [0, 1, 2]):
        rows += sections.yoso_rows(random_inputs(1, 2, n, 32, 1.0, seed, CPU), [8, 32, 128, 2048], "auto", seed)
    frame = pd.DataFrame(rows)
    trend = report.yoso_trend(frame)
    assert trend.attrs["monotone_in_m"]
    assert (trend["curvature"] <= 0.01).all() and (trend["per_doubling"] > 0).all(), trend
    assert frame[frame["m"] == 2048]["mean_angle"].max() < 0.35  # m → ∞: YOSO-E


def test_lra_fidelity_smoke_on_a_trained_checkpoint(tmp_path, data_dir):
    run_command(["lra-train", "trainer=smoke", "attention=learned_hash", "trainer.max_steps=4", "hydra.run.dir=run",
                 *SMALL_LISTOPS], tmp_path, data_dir)
    result = run_command(["lra-fidelity", "preset=smoke", "checkpoint=run", "hydra.run.dir=out"], tmp_path, data_dir)
    out = tmp_path / "out"
    tables = {s: pd.read_csv(out / f"fidelity_{s}.csv") for s in report.COLUMNS}
    for section, frame in tables.items():
        assert list(frame.columns) == report.COLUMNS[section]
        assert set(frame["input"]) == {"random", "listops layer 0", "listops layer 1"}, section
    backends = tables["backends"]
    assert set(backends["backend"]) == set(attention_zoo.names())
    assert "LHA (trained)" in set(backends["label"])
    assert (backends[backends["backend"] == "softmax"]["relative_error"] < 1e-6).all()
    sparse = backends.dropna(subset=["keys_per_query"])
    assert set(sparse["backend"]) == {"longformer", "lsh", "reformer", "learned_hash", "local", "sparse_transformer",
                                      "bigbird"}
    assert (sparse["utility"] <= sparse["utility_ceiling"] + 1e-9).all()
    oracles = tables["oracles"]
    assert (oracles[oracles["max_support"].notna()]["relative_error"] < 1e-9).all()
    for name in ("fidelity_backends.png", "fidelity_oracles.png", "fidelity_yoso.png"):
        assert (out / name).stat().st_size > 10_000
    assert "Mean angle falls as m grows at every n: **yes**" in result.stdout
    best = tmp_path / "run" / "checkpoints" / "best.pt"
    best.write_bytes(best.read_bytes()[:100])  # a damaged checkpoint: one line, not a traceback
    report_files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.suffix != ".log"}
    damaged = run_command(["lra-fidelity", "preset=smoke", "checkpoint=run", "hydra.run.dir=out"], tmp_path, data_dir,
                          check=False)
    last = damaged.stderr.strip().splitlines()[-1]
    assert damaged.returncode == 1 and last.startswith("error: cannot capture from checkpoint=run: the weights in "
                                                       "run/checkpoints/best.pt are unreadable"), last
    assert "Traceback" not in damaged.stderr and "resume" not in last and "pass another run as checkpoint=" in last
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.suffix != ".log"} == report_files, \
        "the earlier report stays until a run's inputs are taken (its log says why it stopped)"
    best.unlink()  # a run that has not validated yet: its last weights, said loudly, never silently
    latest = run_command(["lra-fidelity", "preset=smoke", "sections=[oracles]", "checkpoint=run", "hydra.run.dir=out3"],
                         tmp_path, data_dir)
    assert "run has no best.pt (it has not validated yet): measuring last.pt" in latest.stderr + latest.stdout
    said = "(last.pt: the run has no best.pt yet)"
    assert "captured from run, last.pt: the run has no best.pt yet" in (tmp_path / "out3" / "fidelity.md").read_text()
    inputs = set(pd.read_csv(tmp_path / "out3" / "fidelity_oracles.csv")["input"])
    assert inputs == {"random", f"listops layer 0 {said}", f"listops layer 1 {said}"}, inputs


def test_fidelity_input_mistakes_end_with_one_line_naming_the_fix(tmp_path):
    for args, code, expected in ((["sections=[yoso,speed]"], 2, "unknown section speed"),
                                 (["options.nystrom.num_landmark=8"], 2, "did you mean 'num_landmarks'"),
                                 (["checkpoint=nowhere"], 1, "is not an lra-train run directory"),
                                 (["yoso_hash=[8]"], 2, "did you mean 'yoso_hashes'")):
        result = run_command(["lra-fidelity", "preset=smoke", *args], tmp_path, tmp_path, check=False)
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == code and last.startswith("error:") and expected in last, (args, last)
