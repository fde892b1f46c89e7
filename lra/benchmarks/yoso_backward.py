"""How noisy is YOSO's lower-bound gradient (paper eq. 4), with exact per-pair weights (the paper's
estimator, the default) and with ``backward_projections`` = p random projections per hash?

    python -m lra.benchmarks.yoso_backward [--n 512] [--draws 20] [--device cpu]

For fixed q, k, v and output gradient G, the sampled ∇Q of Σ G ⊙ (1/m) Σ_h B_h V is compared with its
expectation, the dense lower-bound gradient [(G Vᵀ) ⊙ (τ/2) E] K of YOSO-E (through the same
normalization of q). Per draw (same hashes for every p): the relative error ‖ĝ − ḡ‖ / ‖ḡ‖, and the
part the projections add, ‖ĝ_p − ĝ_exact‖ / ‖ḡ‖. Columns are means over the draws.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd
import torch

import attention_zoo
from attention_zoo.yoso_e import LowerBoundExpectation
from lra.commands.config_errors import at_the_edge


def inputs(batch_heads: int, n: int, d: int, seed: int):
    """q, k with a spread of angles (a shared direction plus noise), v and the output gradient."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, 1, d, generator=g)
    q, k = (shared + torch.randn(batch_heads, n, d, generator=g) for _ in range(2))
    v, grad = (torch.randn(batch_heads, n, d, generator=g) for _ in range(2))
    return q, k, v, grad


def gradient_of_q(sample, q, k, v, grad):
    q = q.clone().requires_grad_()
    (gradient,) = torch.autograd.grad((sample(q, k, v) * grad).sum(), q)
    return gradient


def measure(n: int, d: int, hashes: int, draws: int, projections, device: str) -> pd.DataFrame:
    tau = math.ceil(math.log2(n))
    q, k, v, grad = (t.to(device) for t in inputs(4, n, d, seed=0))
    mask = torch.ones(4, n, device=device)

    def expected(q, k, v):
        qn, kn = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
        return LowerBoundExpectation.apply(qn[:, None], kn[:, None], v[:, None], mask, tau)[:, 0]

    mean = gradient_of_q(expected, q, k, v, grad)
    scale = mean.norm()
    rows = []
    exact_draws = []
    for p in projections:
        attention = attention_zoo.build("yoso", num_heads=1, head_dim=d, max_seq_len=n, num_hashes=hashes,
                                        backward_projections=p).to(device).train()
        errors, extra = [], []
        for s in range(draws):
            torch.manual_seed(1000 + s)  # the same hash functions for every p
            estimate = gradient_of_q(lambda q, k, v: attention.sample(q[:, None], k[:, None], v[:, None],
                                                                      mask.bool()), q, k, v, grad)
            errors.append(float((estimate - mean).norm() / scale))
            if p is None:
                exact_draws.append(estimate)
            else:
                extra.append(float((estimate - exact_draws[s]).norm() / scale))
        rows.append({"backward": "exact weights (paper)" if p is None else f"p = {p} projections",
                     "relative error of ∇Q": sum(errors) / draws,
                     "added by the projections": sum(extra) / draws if extra else 0.0})
    return pd.DataFrame(rows)


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--hashes", type=int, default=32)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--projections", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    if args.n < 2:
        parser.error(f"--n {args.n}: it must be >= 2 (τ = log2 n bits a code)")
    for value, name in ((args.head_dim, "--head-dim"), (args.hashes, "--hashes"), (args.draws, "--draws"),
                        (min(args.projections), "--projections")):
        if value < 1:
            parser.error(f"{name} {value}: it must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    table = measure(args.n, args.head_dim, args.hashes, args.draws, [None, *args.projections], args.device)
    print(f"n = {args.n}, head_dim = {args.head_dim}, m = {args.hashes}, τ = {math.ceil(math.log2(args.n))}, "
          f"{args.draws} draws")
    print(table.to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
