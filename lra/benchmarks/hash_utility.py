"""Does learning to hash pay? Train with learned_hash, then compare the attention utility of its
buckets with plain LSH's on the trained layer's own queries and keys (a benchmark, not a test).

    python -m lra.benchmarks.hash_utility [--steps 200] [--buckets 8] [override ...]

Attention utility (LHA paper): for each real query, the exact softmax attention mass on the keys
its buckets let it see, averaged over queries (LHA's attention is on its LayerNorm'd q and k). Also
reported: the auxiliary (utility KL) loss at the start and end of training, the mean number of keys
each query sees, and the share of real queries no bucket selects.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir

import attention_zoo
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.training import Trainer


def utility(q, k, mask, backend) -> dict:
    """Attention utility of ``backend``'s buckets against the attention it approximates (LHA: on its
    LayerNorm'd q, k), keys per query, and the share of real queries in no bucket."""
    own_q, own_k = backend.scored_qk(q, k) if hasattr(backend, "scored_qk") else (q, k)
    scores = (own_q @ own_k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    attention = torch.softmax(scores.masked_fill(~mask[:, None, None, :], float("-inf")), dim=-1)
    attended = backend.attended_keys(q, k, mask)
    real = mask[:, None, :].expand(attention.shape[:3])
    return {"attention utility": (attention * attended).sum(-1)[real].mean().item(),
            "keys per query": attended.sum(-1).float()[real].mean().item(),
            "queries in no bucket": (~attended.any(-1))[real].float().mean().item()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    register_configs()
    register_resolvers()
    overrides = ["experiment=quickstart", "attention=learned_hash", f"attention.num_buckets={args.buckets}",
                 f"trainer.max_steps={args.steps}", "trainer.progress_bar=false", *args.overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, Path(run_dir), announce=lambda m: None)
        aux = [float(trainer.train_step()["aux_loss"]) for _ in range(args.steps)]

        captured = {}
        layer = trainer.model.encoder.blocks[0].attention.backend
        hook = layer.register_forward_hook(lambda m, inputs, out: captured.update(qkvm=inputs))
        trainer.model.eval()
        with torch.no_grad():
            trainer._forward(trainer.data.splits["val"], np.arange(16))
        hook.remove()
    q, k, _, mask = (t.float() if t.is_floating_point() else t for t in captured["qkvm"])

    torch.manual_seed(0)
    options = {"num_buckets": args.buckets}
    untrained = attention_zoo.build("learned_hash", num_heads=q.shape[1], head_dim=q.shape[-1], max_seq_len=q.shape[2], **options)
    lsh = attention_zoo.build("lsh", num_heads=q.shape[1], head_dim=q.shape[-1], max_seq_len=q.shape[2], **options).eval()
    rows = []
    with torch.no_grad():
        for name, backend in [("LHA (trained)", layer), ("LHA (untrained scorers)", untrained), ("LSH", lsh)]:
            rows.append({"buckets of": name, **utility(q, k, mask, backend)})
        # LSH with as many keys per query as the trained LHA layer, for a fair comparison.
        real_length = mask.sum(-1).float().mean().item()
        matched = max(1, round(real_length / rows[0]["keys per query"]))
        lsh_matched = attention_zoo.build("lsh", num_heads=q.shape[1], head_dim=q.shape[-1], max_seq_len=q.shape[2],
                                          num_buckets=matched).eval()
        rows.append({"buckets of": f"LSH, {matched} buckets (matched budget)", **utility(q, k, mask, lsh_matched)})
    window = max(1, args.steps // 10)
    print(f"learned_hash, {args.buckets} buckets, {args.steps} steps on quickstart ListOps (n = {q.shape[2]}); "
          f"aux loss: first {window} steps {np.mean(aux[:window]):.4f} -> last {window} steps {np.mean(aux[-window:]):.4f}")
    frame = pd.DataFrame(rows).set_index("buckets of")
    frame["utility per key (x1000)"] = 1000 * frame["attention utility"] / frame["keys per query"]
    print(frame.round(4).to_markdown())


if __name__ == "__main__":
    main()
