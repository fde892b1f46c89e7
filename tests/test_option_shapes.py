"""Options against the input length N a backend is built for: a value that cannot serve N is refused by
the backend's ``check_shape`` (so lra-train refuses it before anything is written), the largest value
that can is built and run; a value that stops mattering past n is computed at n's cost."""

import re

import pytest
import torch

import attention_zoo
from attention_zoo.options import InvalidOption
from conftest import run_command

HEADS, HEAD_DIM, N = 2, 8, 16
TAU_LIMIT = 2**20  # the longest input whose default τ = ⌈log2 N⌉ fits the kernels' 20 bits
TAU_RULE = f"a whole number between 1 and 20 for the input length N = {TAU_LIMIT + 1}"

# case: (backend, options, the input length that refuses them, the rule's words, the options just inside, the
# length they are built for)
BOUNDS = {
    "yoso default τ": ("yoso", {"impl": "torch"}, TAU_LIMIT + 1, TAU_RULE, {"impl": "torch"}, TAU_LIMIT),
    "yoso_c default τ": ("yoso_c", {"impl": "torch"}, TAU_LIMIT + 1, TAU_RULE, {"impl": "torch"}, TAU_LIMIT),
    "yoso_c conv_window": ("yoso_c", {"impl": "torch", "conv_window": 33}, N, "at most 2N − 1 = 31",
                           {"impl": "torch", "conv_window": 31}, N),
    "nystrom conv_kernel_size": ("nystrom", {"num_landmarks": 8, "conv_kernel_size": 33}, N, "at most 2N − 1 = 31",
                                 {"num_landmarks": 8, "conv_kernel_size": 31}, N),
    "sinkhorn block_size": ("sinkhorn", {"block_size": N + 1}, N, f"at most the input length N = {N}",
                            {"block_size": N}, N),
    "lsh num_buckets": ("lsh", {"num_buckets": N + 2}, N, f"at most the input length N = {N}", {"num_buckets": N}, N),
    "reformer num_buckets": ("reformer", {"num_buckets": N + 2, "chunk_size": 4}, N,
                             f"0 (the reference's rule) or at most the input length N = {N}",
                             {"num_buckets": N, "chunk_size": 4}, N),
    "learned_hash num_buckets": ("learned_hash", {"num_buckets": N + 1}, N, f"at most the input length N = {N}",
                                 {"num_buckets": N}, N),
}


def inputs(n, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, HEADS, n, HEAD_DIM, generator=generator) for _ in range(3))
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n // 2:] = False
    return q, k, v, mask


@pytest.mark.parametrize("case", BOUNDS)
def test_an_option_beyond_the_input_length_is_refused_and_the_bound_builds_and_runs(case):
    name, refused, refused_at, rule, inside, built_at = BOUNDS[case]
    with pytest.raises(InvalidOption, match="it must be " + re.escape(rule)):
        attention_zoo.spec(name, **refused).check_shape(HEADS, HEAD_DIM, refused_at)
    torch.manual_seed(0)
    attention = attention_zoo.build(name, num_heads=HEADS, head_dim=HEAD_DIM, max_seq_len=built_at, **inside).eval()
    q, k, v, mask = inputs(min(built_at, N))  # built for 2^20 positions (τ = 20), run on a short input
    out = attention(q, k, v, mask)
    assert out.shape == v.shape and torch.isfinite(out).all()


# name: options whose value past n gives the output of n, which used to pad every sequence to it
PAST_THE_LENGTH = {
    "local": ({"block_size": 10**6, "impl": "eager"}, {"block_size": N, "impl": "eager"}),
    "sparse_transformer": ({"block_size": 10**6, "impl": "eager"}, {"block_size": N - 1, "impl": "eager"}),
    "learned_hash": ({"num_buckets": 4, "local_heads": 1, "local_block_size": 10**6},
                     {"num_buckets": 4, "local_heads": 1, "local_block_size": N}),
}


@pytest.mark.parametrize("name", PAST_THE_LENGTH)
def test_a_block_past_the_input_length_is_computed_as_one_of_that_length(name):
    huge, whole = PAST_THE_LENGTH[name]
    outputs = []
    for options in (huge, whole):
        torch.manual_seed(0)
        attention = attention_zoo.build(name, num_heads=HEADS, head_dim=HEAD_DIM, max_seq_len=N, **options).eval()
        outputs.append(attention(*inputs(N)))
    torch.testing.assert_close(outputs[0], outputs[1])


def test_lra_train_refuses_a_block_longer_than_the_input_in_one_line_before_writing(tmp_path, data_dir):
    result = run_command(["lra-train", "trainer=smoke", "task=listops", "attention=sinkhorn",
                          "attention.block_size=100000"], tmp_path, data_dir, check=False)
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert line.startswith("error: invalid value for attention.block_size: 100000; it must be at most the input "
                           "length N = 1024 (N: a single block, nothing to sort)"), line
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "a refused config leaves no record and no folder"
