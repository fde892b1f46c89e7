"""*YOSO's two backwards for the same hashes: ``backward=exact`` (each colliding pair per hash weighted by
f'/f, averaged over the m hashes) against ``backward=exact_collided`` (the YOSO authors' yoso_v2 kernel:
each pair that collided at least once, weighted by f'(0.99·q̂·k̂) from their tables).

    python -m lra.benchmarks.yoso_star_backward [--batch 2]

On the *YOSO-16 row's ListOps model at initialization (generated ListOps, 500–2,000 tokens padded to
2,048; τ = 11, m = 16), per layer: the q, k, v its attention receives in a training step and the
gradient at its sampled output (before the ℓ2 normalization); then, with one draw of hashes, ∇q̂ and ∇k̂
on the unit rows of both backwards: ‖authors − ours‖ / ‖ours‖, their norm ratio and cosine, and each
one's cosine with the true derivative of the expectation (dense, float64). Queries that collide with
no key are left out of that last comparison: both backwards give them nothing, and their ℓ2
normalization's gradient (g/ε) would dominate the dense one. Also the share of colliding pairs that
the authors' workspace would drop (their kernel keeps one key per slot j mod 1,024 and query), and the
relative difference of the whole model's parameter gradients in one training step under each backward
(same seed: same hashes, same dropout).
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

import attention_zoo.yoso as yoso
from attention_zoo import _yoso_ops as ops
from lra.benchmarks.reference_quirks import compose_row, listops_batch
from lra.data import listops
from lra.model import Classifier
from lra.validation import attention_spec


def listops_labels(count: int) -> torch.Tensor:
    settings = listops.GeneratorSettings(seed=0, num_train=count, num_val=0, num_test=0)
    return torch.as_tensor([label for _, _, label in listops.generate(settings)])


def training_step(backward: str, batch: int, record: bool = False):
    """One forward and backward of the *YOSO-16 ListOps model (seed 0) under ``backward``: the model,
    and with ``record`` each layer's attention inputs (q, k, v, mask) and output gradient."""
    cfg = compose_row("yoso_table3/star_yoso_16", "listops", f"attention.backward={backward}")
    ids = listops_batch(batch)
    torch.manual_seed(0)
    model = Classifier(cfg.model, cfg.task, attention_spec(cfg), ids.shape[1]).train()
    layers = []

    def hook(module, args, output):
        seen = dict(q=args[0].detach(), k=args[1].detach(), v=args[2].detach(), mask=args[3], module=module)
        output.register_hook(lambda g: seen.update(grad=g.detach()))
        layers.append(seen)

    if record:
        for block in model.encoder.blocks:
            block.attention.backend.register_forward_hook(hook)
    logits = model([ids], [ids != 0])
    torch.nn.functional.cross_entropy(logits, listops_labels(batch)).backward()
    return model, layers


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def compare_layer(seen: dict, seed: int = 1) -> dict:
    module, mask = seen["module"], seen["mask"]
    batch, heads, n, d = seen["q"].shape
    flat = batch * heads
    q, k, v = (seen[x].reshape(flat, n, -1) for x in ("q", "k", "v"))
    o, tau = module.options, module.tau
    torch.manual_seed(seed)
    draws = yoso.draw(flat, d, v.shape[-1], o.num_hashes, tau, o.hashing, v.shape[-1], None, q.device)
    codes_q, codes_k = (yoso.hash_codes(x, draws, o.num_hashes, tau, "torch") for x in (q, k))
    key_weight = mask.to(q.dtype).repeat_interleave(heads, dim=0)
    ones = q.new_ones(flat, 1, 1, n)
    sampled = ops.cumulation(codes_q, codes_k, ones, key_weight[:, None, None], v, tau, "torch").requires_grad_()
    (grad,) = torch.autograd.grad(F.normalize(sampled, dim=-1).reshape(seen["v"].shape), sampled, seen["grad"])
    unit_q, unit_k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)

    ours_q = ops.pair_gradient(codes_q, codes_k, unit_q, unit_k, grad, v, key_weight, tau, o.exact_clamp, "torch")
    ours_k = ops.pair_gradient(codes_k, codes_q, unit_k, unit_q, v, grad, torch.ones_like(key_weight), tau,
                               o.exact_clamp, "torch") * key_weight[..., None]
    authors_q, authors_k = ops.authors_pair_gradients(codes_q, codes_k, unit_q, unit_k, v, key_weight, grad, tau)

    collided = ops.collided_at_least_once(codes_q, codes_k) & (key_weight[:, None, :] > 0)
    answered = collided.any(-1, keepdim=True)
    x = (unit_q @ unit_k.transpose(-1, -2)).double().clamp(-o.exact_clamp, o.exact_clamp)
    slope = tau * (1 - torch.arccos(x) / math.pi) ** (tau - 1) / (math.pi * torch.sqrt(1 - x * x))
    dense = (grad * answered).double() @ v.double().transpose(-1, -2) * key_weight.double()[:, None, :] * slope
    true_q, true_k = dense @ unit_k.double(), dense.transpose(-1, -2) @ unit_q.double()

    real = collided & (key_weight[:, :, None] > 0)
    slots = torch.nn.functional.pad(real, (0, (-n) % ops.AUTHORS_WORKSPACE)).reshape(flat, n, -1, ops.AUTHORS_WORKSPACE)
    dropped = (slots.sum(2) - 1).clamp(min=0).sum()
    row = {"real queries with no collision": float(1 - answered.squeeze(-1)[key_weight > 0].double().mean()),
           "colliding pairs / real pairs": float(real.sum() / (key_weight.sum(1) ** 2).sum()),
           "colliding pairs the 1,024 slots drop": float(dropped / real.sum())}
    for name, ours, authors, true in (("dq", ours_q, authors_q, true_q), ("dk", ours_k, authors_k, true_k)):
        row[f"{name}: |authors - ours| / |ours|"] = relative(authors, ours)
        row[f"{name}: |authors| / |ours|"] = float(authors.norm() / ours.norm())
        row[f"{name}: cosine(authors, ours)"] = cosine(authors, ours)
        row[f"{name}: cosine with the true derivative (ours, authors)"] = (cosine(ours, true), cosine(authors, true))
    return row


def model_gradients(batch: int) -> dict:
    grads = {}
    for backward in ("exact", "exact_collided"):
        model, _ = training_step(backward, batch)
        grads[backward] = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    ours, authors = grads["exact"], grads["exact_collided"]
    whole = relative(torch.cat([authors[n].flatten() for n in ours]), torch.cat([ours[n].flatten() for n in ours]))
    out = {"all parameters: |authors - ours| / |ours|": whole}
    for name in ours:
        if name.endswith(("query.weight", "key.weight", "value.weight")):
            out[f"{name}: |authors - ours| / |ours|"] = relative(authors[name], ours[name])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args(argv)
    _, layers = training_step("exact", args.batch, record=True)
    for index, seen in enumerate(layers):
        print(f"layer {index + 1}")
        for key, value in compare_layer(seen).items():
            text = ", ".join(f"{x:.3f}" for x in value) if isinstance(value, tuple) else f"{value:.4f}"
            print(f"  {key}: {text}")
    print("one training step, parameter gradients")
    for key, value in model_gradients(args.batch).items():
        print(f"  {key}: {value:.4f}")


if __name__ == "__main__":
    main()
