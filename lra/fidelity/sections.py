"""The three measurements of ``lra-fidelity``, each a list of row dicts per set of attention inputs:

- ``backend_rows``: every backend's output against exact softmax; for sparse backends also their
  keys-per-query budget, attention utility, the optimal-v-oblivious error at that budget and, where
  they hash, bucket balance.
- ``oracle_rows``: the value-aware oracles (Gupta & Berant 2021) against r.
- ``yoso_rows``: YOSO-m against YOSO-E (the YOSO paper's Figure 8).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import torch
import torch.nn.functional as F

import attention_zoo
from lra.fidelity import measures
from lra.fidelity.inputs import AttentionInputs


def _where(inputs: AttentionInputs) -> dict:
    return {"input": inputs.source, "n": inputs.n, "seed": inputs.seed}


def build_backend(name: str, inputs: AttentionInputs, options: dict, seed: int) -> attention_zoo.Attention:
    """``name`` for these inputs' shape, in evaluation mode; its random draws seeded by ``seed``."""
    torch.manual_seed(seed)
    _, heads, n, d = inputs.q.shape
    return attention_zoo.build(name, num_heads=heads, head_dim=d, max_seq_len=n, **options).to(inputs.q.device).eval()


def shared_qk_attention(q, v, mask) -> torch.Tensor:
    """Reformer's own target: softmax(q·q̂ᵀ/√d) over real keys, a token not attending to itself
    unless it has no other key (float64 [B, H, n, n])."""
    q = q.double()
    scores = (q @ F.normalize(q, dim=-1).transpose(-1, -2)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    itself = torch.eye(q.shape[2], dtype=torch.bool, device=q.device)
    others = (mask.sum(-1) > 1)[:, None, None, None]
    return torch.softmax(scores.masked_fill(itself & others, float("-inf")), dim=-1)


def _sparse_analysis(backend, inputs: AttentionInputs, attention, exact) -> dict:
    """Budget (keys per query), utility and its ceiling (each query's own budget of its largest
    weights), and the optimal-v-oblivious error at the per-query budgets. Utility is measured against
    the attention the backend itself approximates (Reformer's shared-QK, LHA's on LayerNorm'd q, k)."""
    q, k, mask = inputs.q, inputs.k, inputs.mask
    if getattr(backend, "shared_qk", False):
        own = shared_qk_attention(q, inputs.v, mask)
    elif hasattr(backend, "scored_qk"):  # LHA scores LayerNorm'd q and k
        own = measures.exact_attention(*backend.scored_qk(q, k), inputs.v, mask)[1]
    else:
        own = attention
    attended = backend.attended_keys(q, k, mask)
    row = measures.attention_utility(own, attended, mask)
    budgets = attended.sum(-1)
    row["utility_ceiling"] = measures.attention_utility(own, measures.keep_top(own, budgets) > 0, mask)["utility"]
    oblivious = measures.output_error(measures.keep_top(attention, budgets) @ inputs.v.double(), exact, mask)
    row["oblivious_error_at_budget"] = oblivious["relative_error"]
    if hasattr(backend, "bucket_counts"):
        row.update(measures.bucket_balance(*backend.bucket_counts(q, k, mask)))
    return row


def backend_rows(inputs: AttentionInputs, names: Sequence[str], options: Dict[str, dict], seed: int,
                 failure_line: Callable[[Exception], str] = None) -> List[dict]:
    """Each backend (and the checkpoint's own trained layer) against exact softmax on ``inputs``. With
    ``failure_line``, a backend that raises (out of memory at this n, a backend of yours) is a row with
    that line as its ``error`` and the others are measured; without, the error propagates."""
    exact, attention = measures.exact_attention(inputs.q, inputs.k, inputs.v, inputs.mask)
    candidates = []  # (name, module or None, trained, the line of a build that raised)
    for name in names:  # every build before any call: a build seeds the global generator for its own draws
        try:
            candidates.append((name, build_backend(name, inputs, options.get(name, {}), seed), False, None))
        except Exception as exc:
            if failure_line is None:
                raise
            candidates.append((name, None, False, failure_line(exc)))
    if inputs.trained_backend is not None and inputs.trained_backend.name != "softmax":
        candidates.append((inputs.trained_backend.name, inputs.trained_backend, True, None))
    rows = []
    with torch.no_grad():
        for name, backend, trained, refused in candidates:
            if backend is None:
                rows.append(_failed(inputs, name, options.get(name, {}), refused))
                continue
            label = backend.label(backend.options) + (" (trained)" if trained else "")
            try:
                output = backend(inputs.q, inputs.k, inputs.v, inputs.mask)
                row = {**_where(inputs), "backend": name, "label": label,
                       **measures.output_error(output, exact, inputs.mask)}
                if hasattr(backend, "attended_keys"):
                    row.update(_sparse_analysis(backend, inputs, attention, exact))
            except Exception as exc:
                if failure_line is None:
                    raise
                row = {**_where(inputs), "backend": name, "label": label, "error": failure_line(exc)}
            rows.append(row)
            if inputs.q.is_cuda:
                torch.cuda.empty_cache()  # what a backend that ran out of memory held is not the next one's
    return rows


def _failed(inputs: AttentionInputs, name: str, options: dict, line: str) -> dict:
    """The row of a backend that could not be built for these inputs."""
    try:
        label = attention_zoo.spec(name, **options).label
    except Exception:
        label = name
    return {**_where(inputs), "backend": name, "label": label, "error": line}


def _query_sample(inputs: AttentionInputs, count: int, seed: int):
    """Up to ``count`` (batch, head, query) triples of real queries, drawn with a seeded generator."""
    batch, heads, n, _ = inputs.q.shape
    real = inputs.mask[:, None, :].expand(batch, heads, n).reshape(-1).nonzero()[:, 0].cpu()
    generator = torch.Generator().manual_seed(seed)
    flat = real[torch.randperm(len(real), generator=generator)[:count]]
    return flat // (heads * n), flat // n % heads, flat % n


def oracle_rows(inputs: AttentionInputs, budgets: Sequence[int], sampled_queries: int, seed: int) -> List[dict]:
    """Optimal-v-oblivious-r for each r in ``budgets``; optimal-v-aware-1 (the nearest value) on every
    real query; optimal-v-aware-(d+1) by Carathéodory's reduction on ``sampled_queries`` of them."""
    q, k, v, mask = inputs.q, inputs.k, inputs.v.double(), inputs.mask
    d = q.shape[-1]
    exact, attention = measures.exact_attention(q, k, v, mask)
    rows, ranks = [], measures.weight_ranks(attention)
    for r in budgets:
        error = measures.output_error(measures.keep_top(attention, r, ranks) @ v, exact, mask)
        rows.append({**_where(inputs), "oracle": "v-oblivious", "r": int(r), **error})

    nearest = measures.nearest_value(exact, v, mask)
    rows.append({**_where(inputs), "oracle": "v-aware", "r": 1, **measures.output_error(nearest, exact, mask)})

    batch_index, head_index, query_index = _query_sample(inputs, sampled_queries, seed)
    reduced, kept, support = [], [], 0
    for b in batch_index.unique().tolist():  # one reduction per sequence: its real keys
        chosen, keys = batch_index == b, mask[b].nonzero()[:, 0]
        weights = attention[b, head_index[chosen], query_index[chosen]][:, keys]
        values = v[b, head_index[chosen]][:, keys]
        sparse = measures.caratheodory(weights, values)
        support = max(support, int((sparse > 0).sum(-1).max()))
        reduced.append(torch.einsum("rn,rnd->rd", sparse, values))
        kept.append(torch.einsum("rn,rnd->rd", weights, values))
    if reduced:  # compared as one sequence of the sampled rows, all real
        approx, truth = torch.cat(reduced)[None, None], torch.cat(kept)[None, None]
        every = torch.ones(1, truth.shape[2], dtype=torch.bool, device=truth.device)
        rows.append({**_where(inputs), "oracle": "v-aware", "r": d + 1, "max_support": support,
                     **measures.output_error(approx, truth, every)})
    return rows


def yoso_rows(inputs: AttentionInputs, hashes: Sequence[int], impl: str, seed: int) -> List[dict]:
    """YOSO-m for each m against YOSO-E on the same inputs, same τ (log2 n by default)."""
    reference = build_backend("yoso_e", inputs, {}, seed)
    rows = []
    with torch.no_grad():
        expectation = reference(inputs.q, inputs.k, inputs.v, inputs.mask)
        for m in hashes:
            sampled = build_backend("yoso", inputs, {"num_hashes": int(m), "impl": impl}, seed * 1000 + int(m))
            output = sampled(inputs.q, inputs.k, inputs.v, inputs.mask)
            rows.append({**_where(inputs), "m": int(m), "tau": reference.tau,
                         **measures.output_error(output, expectation, inputs.mask)})
    return rows
