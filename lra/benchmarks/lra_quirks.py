"""The LRA code's quirks that LRA Table 1 and the learning-to-hash table reproduce, and YOSO's
evaluation hashes, each measured before and after at initialization (run through
``python -m lra.benchmarks.reference_quirks``, which prints every section)."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

import attention_zoo
from lra.benchmarks.reference_quirks import listops_batch, pathfinder_batch
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.model import Classifier
from lra.validation import attention_spec


def compose_cell(row: str, task: str, *overrides: str):
    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=["experiment=lra_table1", f"setup=lra_table1/{task}",
                                                        f"row=lra_table1/{row}", *overrides])


def built(cfg, attention=None, length=None) -> Classifier:
    torch.manual_seed(0)
    return Classifier(cfg.model, cfg.task, attention or attention_spec(cfg), length or cfg.task.max_length).eval()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def embedding_change(batch: int) -> dict:
    """Two different ListOps tokens at one position, as they enter block 1: their cosine, and the
    token rows' norm over the position rows' (LRA Table 1's ListOps model, sinusoidal positions)."""
    out = {}
    for label, std in (("N(0, 0.02) (before)", "0.02"), ("N(0, 1) (the LRA code)", "1.0")):
        model = built(compose_cell("transformer", "listops", f"model.token_embedding_init_std={std}"), length=64)
        tokens = model.encoder.token_embedding.weight.detach()[1:17]  # the real ListOps vocabulary
        positions = model.encoder.position_embedding.weight.detach()[1:64]
        inputs = tokens[:, None, :] + positions[None, :, :]  # [token, position, dim]
        unit = torch.nn.functional.normalize(inputs, dim=-1)
        cosine = torch.einsum("apd,bpd->abp", unit, unit)
        different = ~torch.eye(len(tokens), dtype=torch.bool)
        out[label] = {"cosine of two tokens at one position": round(float(cosine[different].mean()), 3),
                      "|token| / |position|": round(float(tokens.norm(dim=-1).mean() / positions.norm(dim=-1).mean()), 3)}
    return out


def first_layer_inputs(model: Classifier, ids: torch.Tensor):
    seen = {}
    hook = model.encoder.blocks[0].attention.backend.register_forward_hook(
        lambda module, args, output: seen.update(q=args[0], k=args[1], v=args[2], mask=args[3], out=output))
    with torch.no_grad():
        logits = model([ids], [torch.ones_like(ids, dtype=torch.bool)])
    hook.remove()
    return seen, logits


def initialization_change(batch: int) -> dict:
    """LRA Table 1's ListOps Transformer: layer 1's attention logits q·k/√d and the classifier's logits,
    their spread with PyTorch's linear initialisers and biases against the LRA code's."""
    ids = listops_batch(batch, 2000)
    out = {}
    for label, overrides in (("PyTorch defaults, with biases (before)", ("model.initialization=torch",
                                                                         "model.attention_bias=true")),
                             ("the LRA code's", ())):
        seen, logits = first_layer_inputs(built(compose_cell("transformer", "listops", *overrides)), ids)
        scores = seen["q"] @ seen["k"].transpose(-1, -2) / seen["q"].shape[-1] ** 0.5
        out[label] = {"layer-1 attention logit std": round(float(scores.std()), 3),
                      "classifier logit std": round(float(logits.std()), 3)}
    return out


def local_grouping_change(batch: int) -> dict:
    """LRA Table 1's ListOps Local row: strided groups (the LRA code) against contiguous blocks."""
    cfg = compose_cell("local", "listops")
    strided = built(cfg)
    seen, _ = first_layer_inputs(strided, listops_batch(batch, 2000))
    q, k, v, mask = seen["q"], seen["k"], seen["v"], seen["mask"]
    options = dataclasses.replace(attention_spec(cfg).options, grouping="contiguous", dropout=0.0)
    contiguous = attention_zoo.AttentionSpec("local", options).build(q.shape[1], q.shape[-1], q.shape[2]).eval()
    with torch.no_grad():
        blocks = contiguous(q, k, v, mask)
    strided_keys = strided.encoder.blocks[0].attention.backend.attended_keys(q[:1, :1], k[:1, :1], None)[0, 0]
    block_keys = contiguous.attended_keys(q[:1, :1], k[:1, :1], None)[0, 0]
    jaccard = float((strided_keys & block_keys).sum() / (strided_keys | block_keys).sum())
    return {"positions": q.shape[2], "attended pairs shared (Jaccard)": round(jaccard, 4),
            "layer-1 attention output, contiguous vs strided (relative)": round(relative(blocks, seen["out"]), 3)}


def sparse_cls_change(batch: int) -> dict:
    """LRA Table 1's Pathfinder Sparse Transformer: the pooled vector without a CLS position (now)
    against pixel 0 attending and attended densely (before), the same weights."""
    cfg = compose_cell("sparse_transformer", "pathfinder")
    ids = pathfinder_batch(batch)
    spec = attention_spec(cfg)
    dense_first = attention_zoo.AttentionSpec(spec.name, dataclasses.replace(spec.options, cls_token=True))
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        after = built(cfg, spec).encoder(ids, mask)
        before = built(cfg, dense_first).encoder(ids, mask)
    return {"pooled vector, relative change": round(relative(before, after), 4)}


def evaluation_hash_spread(run_dir: str, draws: int) -> dict:
    """A finished YOSO run's best checkpoint on its test split: accuracy with the hashes fixed per module
    (the harness's default) and, ``draws`` times, with fresh hashes at every call (the authors')."""
    from lra.build import build
    from lra.checkpoint import BEST, load
    from lra.config import saved_run_config
    from lra.run import RunDirectory
    from lra.validation import validate

    register_configs()
    register_resolvers()
    folder = Path(run_dir)
    cfg = RunDirectory(folder).load_resolved(saved_run_config)
    cfg.trainer.device, cfg.trainer.compile = "cpu", False
    run_config = validate(cfg)
    spec = attention_spec(cfg)
    components = build(run_config, spec, announce=lambda message: None)
    weights = load(folder / "checkpoints" / BEST)["model"]
    split = components.data.splits["test"]
    batch = run_config.trainer.evaluation_batch_size  # the run's: fixed draws are made per batch shape

    def accuracy(eval_hashes: str) -> float:
        options = dataclasses.replace(spec.options, eval_hashes=eval_hashes)
        model = Classifier(cfg.model, cfg.task, attention_zoo.AttentionSpec(spec.name, options),
                           components.max_length).eval()
        model.load_state_dict(weights)
        correct = 0
        with torch.no_grad():
            for start in range(0, len(split), batch):
                ids, masks, labels = split.gather(np.arange(start, min(start + batch, len(split))), components.max_length)
                logits = model([torch.as_tensor(i) for i in ids], [torch.as_tensor(m) for m in masks])
                correct += int((logits.argmax(-1) == torch.as_tensor(labels)).sum())
        return 100.0 * correct / len(split)

    torch.manual_seed(0)
    fresh = [accuracy("fresh") for _ in range(draws)]
    return {"run": str(folder), "test examples": len(split), "recorded test accuracy": folder_record(folder),
            "fixed hashes": accuracy("fixed"),
            f"fresh hashes, {draws} evaluations: mean": round(statistics.mean(fresh), 2),
            "std": round(statistics.stdev(fresh), 2) if draws > 1 else None,
            "min–max": f"{min(fresh):.2f}–{max(fresh):.2f}"}


def folder_record(folder: Path):
    from lra.run import RunDirectory

    return RunDirectory(folder).read_record().get("test_accuracy")


def sections(batch: int) -> list:
    return [("lra token embeddings", lambda: embedding_change(batch)),
            ("lra initialisers", lambda: initialization_change(min(batch, 2))),
            ("lra local grouping", lambda: local_grouping_change(min(batch, 2))),
            ("lra sparse transformer cls position", lambda: sparse_cls_change(batch))]
