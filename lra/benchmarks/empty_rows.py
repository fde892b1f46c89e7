"""How often a backend gives a real query nothing at all.

    python -m lra.benchmarks.empty_rows [--n 256] [--draws 8]

YOSO: the share of real queries whose sampled output (before the ℓ2 normalization) is exactly zero,
because in none of the m hashes did the query collide with a real key, over m and τ (random unit
q, k; the collision probability of a pair is (1 − θ/π)^τ, so long codes and few hashes leave rows
empty). LHA: the share of real queries that no bucket's balanced top-k selects at initialization
(such a query gets zeros from the hashed heads), over the number of buckets, with buckets taking
the tokens of highest softmax-over-buckets probability (``membership=softmax``, the default) or of
highest raw score (``raw``).
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch

import attention_zoo


def yoso_empty_share(n: int, hashes: int, tau: int, draws: int) -> float:
    empty, total = 0, 0
    for seed in range(draws):
        generator = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(4, 2, n, 32, generator=generator) for _ in range(3))
        torch.manual_seed(seed)
        attention = attention_zoo.build("yoso", num_heads=2, head_dim=32, max_seq_len=n, num_hashes=hashes,
                                        hash_code_len=tau).eval()
        with torch.no_grad():
            rows = attention.sample(q, k, v, torch.ones(4, n, dtype=torch.bool))
        empty += int((rows.abs().sum(-1) == 0).sum())
        total += rows.shape[0] * rows.shape[1]
    return empty / total


def lha_unselected_share(n: int, buckets: int, draws: int, membership: str = "softmax") -> float:
    unselected, total = 0, 0
    for seed in range(draws):
        generator = torch.Generator().manual_seed(seed)
        q, k = (torch.randn(4, 2, n, 32, generator=generator) for _ in range(2))
        torch.manual_seed(seed)
        attention = attention_zoo.build("learned_hash", num_heads=2, head_dim=32, max_seq_len=n, num_buckets=buckets,
                                        membership=membership)
        mask = torch.ones(4, n, dtype=torch.bool)
        _, _, query_index, _ = attention.memberships(q, k, mask)
        member = torch.zeros(4, 2, n, dtype=torch.bool).scatter_(2, query_index.flatten(2), True)
        unselected += int((~member).sum())
        total += member.numel()
    return unselected / total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--draws", type=int, default=8)
    args = parser.parse_args(argv)
    taus = [4, 8, 12, 16, 20]
    rows = [{"m": str(m), **{f"τ = {tau}": yoso_empty_share(args.n, m, tau, args.draws) for tau in taus}} for m in (1, 8, 32)]
    print(f"YOSO: share of real queries with an all-zero sampled row, n = {args.n}, {args.draws} draws of 4 × 2 heads")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f"))
    lha = [{"buckets": str(b), "softmax over buckets (the authors')": lha_unselected_share(args.n, b, args.draws),
            "raw scores": lha_unselected_share(args.n, b, args.draws, "raw")} for b in (4, 8, 16, 32, 64)]
    print(f"\nLHA at initialization: share of real queries no bucket selects, n = {args.n}, by membership rule")
    print(pd.DataFrame(lha).to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
