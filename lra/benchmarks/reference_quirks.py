"""How much each of the cited code's quirks that the paper presets reproduce changes the numbers at
initialization: each preset fix's before and after.

    python -m lra.benchmarks.reference_quirks [--batch 8] [--yoso-run RUN_DIR --draws 10]

YOSO Table 3 (the mlpen code):

- Pooling: the pooled vector of ``mean_unmasked`` (before) against ``mean_zeroed_padding`` (the
  mlpen code's mean of norm(X)·mask over the padded length), on generated ListOps (500–2,000 tokens
  padded to 2,048) and generated Pathfinder-32 images (black pixels are padding under the
  ``ids != 0`` mask), the YOSO Table 3 Softmax model.
- Performer: layer 1's attention output with the mlpen options (``kernel_scale=d``,
  ``padded_keys=zero_vectors``) against our defaults, on the same q, k, v (ListOps batch), each
  against exact softmax attention.
- Reformer: the parameters the bias-free projections remove.
- YOSO's evaluation hashes (``--yoso-run``, a finished YOSO run): its test accuracy with the hashes
  fixed per module and with fresh hashes at every call (the authors'), ``--draws`` times: the spread a
  test number carries.

LRA Table 1 and the learning-to-hash table (the LRA code), on the ListOps setup's model at
initialization (:mod:`lra.benchmarks.lra_quirks`):

- Token embeddings N(0, 1) against N(0, 0.02): the cosine of two different tokens at one position as
  they enter the first block, and |token| / |position|.
- The LRA initialisers and bias-free attention projections against PyTorch's defaults: the spread of
  the first layer's attention logits and of the classifier's logits.
- Local attention's strided groups against contiguous blocks: the attended pairs they share (Jaccard)
  and layer 1's attention output on the same q, k, v.
- Sparse Transformer on Pathfinder without a CLS position against with one: the pooled vector.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from hydra import compose, initialize_config_dir

import attention_zoo
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data import listops, pathfinder_generator
from lra.model import Classifier
from lra.validation import attention_spec


def compose_row(row: str, task: str, *overrides: str):
    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=["experiment=yoso_table3", f"row={row}", f"task={task}",
                                                        *overrides])


def listops_batch(count: int, length: int = 2048) -> torch.Tensor:
    settings = listops.GeneratorSettings(seed=0, num_train=count, num_val=0, num_test=0)
    rows = [listops.encode(source) for _, source, _ in listops.generate(settings)]
    ids = torch.zeros(count, length, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(row)
    return ids


def pathfinder_batch(count: int) -> torch.Tensor:
    geometry = pathfinder_generator.geometry_for(32, "contour_length_14")
    images = [pathfinder_generator.generate_image(geometry, seed=0, index=i)[0] for i in range(count)]
    return torch.as_tensor(np.stack(images).reshape(count, -1).astype(np.int64))


def pooled(cfg, ids: torch.Tensor, pooling: str) -> torch.Tensor:
    cfg.model.pooling = pooling
    torch.manual_seed(0)
    model = Classifier(cfg.model, cfg.task, attention_spec(cfg), ids.shape[1]).eval()
    with torch.no_grad():
        return model.encoder(ids, torch.ones_like(ids, dtype=torch.bool))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over rows of ‖a − b‖ / ‖b‖."""
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).mean())


def pooling_changes(batch: int) -> dict:
    out = {}
    for task, ids in (("listops", listops_batch(batch)), ("pathfinder", pathfinder_batch(batch))):
        cfg = compose_row("yoso_table3/softmax", task)
        before, after = pooled(cfg, ids, "mean_unmasked"), pooled(cfg, ids, "mean_zeroed_padding")
        out[task] = {"padding share": float((ids == 0).float().mean()), "relative change": relative(before, after)}
    return out


def performer_changes(batch: int) -> dict:
    cfg = compose_row("yoso_table3/performer", "listops")
    ids = listops_batch(batch)
    torch.manual_seed(0)
    model = Classifier(cfg.model, cfg.task, attention_spec(cfg), ids.shape[1]).eval()
    seen = {}
    model.encoder.blocks[0].attention.backend.register_forward_hook(
        lambda module, args, output: seen.update(q=args[0], k=args[1], v=args[2], mask=args[3]))
    with torch.no_grad():
        model([ids], [torch.ones_like(ids, dtype=torch.bool)])
    q, k, v, mask = seen["q"], seen["k"], seen["v"], seen["mask"]
    real = mask[:, None, :, None].expand(*q.shape[:3], 1).squeeze(-1)

    def run(name: str, **options) -> torch.Tensor:
        torch.manual_seed(1)  # the same random features for every variant
        attention = attention_zoo.build(name, num_heads=q.shape[1], head_dim=q.shape[-1], max_seq_len=q.shape[2],
                                        **options).eval()
        with torch.no_grad():
            return attention(q, k, v, mask)[real]

    exact = run("softmax")
    default = run("performer")
    cited = run("performer", kernel_scale="d", padded_keys="zero_vectors")
    scale_only = run("performer", kernel_scale="d")
    quarter = q.shape[-1] ** 0.25  # exp(q·k/d) exactly: softmax attention of q / d^{1/4} and k / d^{1/4}
    with torch.no_grad():
        flat = attention_zoo.build("softmax", num_heads=q.shape[1], head_dim=q.shape[-1], max_seq_len=q.shape[2])
        exact_flat = flat(q / quarter, k / quarter, v, mask)[real]
    return {"mlpen options vs defaults": relative(cited, default),
            "kernel_scale=d alone vs defaults": relative(scale_only, default),
            "defaults vs softmax exp(q·k/√d)": relative(default, exact),
            "kernel_scale=d vs softmax exp(q·k/d)": relative(scale_only, exact_flat),
            "mlpen options vs softmax exp(q·k/d)": relative(cited, exact_flat)}


def reformer_change() -> dict:
    counts = {}
    for bias in (True, False):
        cfg = compose_row("yoso_table3/reformer", "listops", f"attention.projection_bias={str(bias).lower()}")
        model = Classifier(cfg.model, cfg.task, attention_spec(cfg), 2048)
        counts[bias] = sum(p.numel() for p in model.parameters())
    return {"parameters with bias": counts[True], "without": counts[False]}


def main(argv=None) -> None:
    from lra.benchmarks import lra_quirks

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--yoso-run", help="a finished YOSO run folder: its test accuracy with fixed and fresh hashes")
    parser.add_argument("--draws", type=int, default=10, help="evaluations with fresh hashes (--yoso-run)")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    sections = [("pooling", lambda: pooling_changes(args.batch)), ("performer", lambda: performer_changes(args.batch)),
                ("reformer", reformer_change), *lra_quirks.sections(args.batch)]
    if args.yoso_run:
        sections.append(("yoso evaluation hashes", lambda: lra_quirks.evaluation_hash_spread(args.yoso_run, args.draws)))
    for name, measure in sections:
        result = measure()
        print(name)
        for key, value in result.items():
            print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
