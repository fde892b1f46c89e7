"""The values LRA Table 1's and the learning-to-hash table's presets set, each with the file or text it
comes from (tests/test_lra_presets.py checks every composed preset against this, and that no preset
file sets a value that is not here). Field paths are the composed config's: ``model.dim``,
``attention.block_size``, ``trainer.lr`` …"""

from __future__ import annotations

LRA = "google-research/long-range-arena (cd31e5c) lra_benchmarks"
CIFAR, PF = f"{LRA}/image/configs/cifar10", f"{LRA}/image/configs/pathfinder32"
LRA_PAPER = "the LRA paper (Tay et al., ICLR 2021), §3 ListOps"
ADAM = f"{LRA}/<task>/train.py create_optimizer: Adam(beta1=0.9, beta2=0.98, eps=1e-9)"
ENCODERS = f"{LRA}/models/*/<model>.py Encoder defaults"
LHA_A5 = "the learning-to-hash paper (Sun, Yang & Yoo, ICLR 2022), appendix A.5"
TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
LHA_TASKS = TASKS[:4]


def cite(source: str, **values) -> dict:
    """{"group.field": (value, source)} from keywords written group__field."""
    return {key.replace("__", "."): (value, source) for key, value in values.items()}


def sizes(source: str, layers: int, dim: int, heads: int, qkv: int, mlp: int) -> dict:
    """The LRA code's num_layers, emb_dim, num_heads, qkv_dim and mlp_dim as our fields: heads of
    qkv_dim / num_heads, and the classifier's hidden width mlp_dim (common_layers.classifier_head)."""
    return {**cite(source, model__num_layers=layers, model__dim=dim, model__num_heads=heads, model__ff_dim=mlp),
            "model.head_dim": (qkv // heads, f"{source}: qkv_dim {qkv} over {heads} heads"),
            "model.classifier_dim": (mlp, f"{source}: mlp_dim, the classifier head's width")}


def schedule(source: str, lr: float, kind: str, weight_decay: float) -> dict:
    return {**cite(source, trainer__lr=lr, trainer__lr_schedule=kind, trainer__weight_decay=weight_decay),
            **cite(ADAM, trainer__beta2=0.98, trainer__eps=1e-9)}


def steps(source: str, batch: int, total: int, warmup: int, every: int, length: int = None) -> dict:
    out = cite(source, task__batch_size=batch, task__max_steps=total, task__warmup_steps=warmup, task__eval_every=every)
    return {**out, **(cite(source, task__max_length=length) if length else {})}


# The LRA code's encoder, the same in every one of its models (conf/model/lra.yaml, which every LRA Table 1
# and learning-to-hash setup selects); lines of models/transformer/transformer.py and layers/common_layers.py,
# the other models' files repeat them.
TRANSFORMER, COMMON = f"{LRA}/models/transformer/transformer.py", f"{LRA}/models/layers/common_layers.py"
ENCODER = {
    **cite(f"{TRANSFORMER}:155 nn.Embed(embedding_init=nn.initializers.normal(stddev=1.0))",
           model__token_embedding_init_std=1.0),
    **cite(f"{TRANSFORMER}:169 pe_init = nn.initializers.normal(stddev=0.02) if learn_pos_emb",
           model__embedding_init_std=0.02),
    **cite(f"{TRANSFORMER}:69-70 and {COMMON}:151-152 kernel_init=xavier_uniform(), bias_init=normal(stddev=1e-6); "
           f"{COMMON}:191-193 classifier_head's nn.Dense: Flax's default lecun_normal, zero bias",
           model__initialization="lra"),
    **cite(f"{TRANSFORMER}:71 nn.SelfAttention(bias=False): Q, K, V and output without bias", model__attention_bias=False),
    **cite("flax.deprecated.nn.LayerNorm(epsilon=1e-6), the LRA code's LayerNorm", model__layer_norm_eps=1e-6),
}

LISTOPS_V1 = f"{LRA}/listops/configs/base_listops_config.py at f866e43 (the first public one) and {LRA_PAPER}"
TC, MATCH = f"{LRA}/text_classification/configs/base_tc_config.py", f"{LRA}/matching/configs/base_match_config.py"
CIFAR_BASE, PF_BASE = f"{CIFAR}/base_cifar10_config.py", f"{PF}/base_pathfinder32_config.py"

SETUPS = {
    "lra_table1/listops": {
        **steps(LISTOPS_V1, 32, 5000, 1000, 20, 2000), **sizes(LISTOPS_V1, 6, 512, 8, 512, 2048),
        **cite(f"{LRA}/listops/train.py passes no classifier_pool: the encoders' default CLS", model__pooling="cls"),
        **cite(ENCODERS, model__position_embedding="sinusoidal", model__dropout=0.1),
        **schedule(LISTOPS_V1, 0.05, "rsqrt", 0.1)},
    "lra_table1/text": {
        **steps(TC, 32, 20000, 8000, 100, 1000), **sizes(TC, 4, 256, 4, 256, 1024),
        **cite(f"{TC} classifier_pool", model__pooling="cls"),
        **cite(ENCODERS, model__position_embedding="sinusoidal", model__dropout=0.1),
        **schedule(TC, 0.05, "rsqrt", 0.1)},
    "lra_table1/retrieval": {
        **steps(MATCH, 32, 5000, 8000, 100, 4000), **sizes(MATCH, 4, 128, 4, 128, 512),
        **cite(f"{MATCH} pooling_mode", model__pooling="cls"),
        **cite(ENCODERS, model__position_embedding="sinusoidal", model__dropout=0.1),
        **schedule(MATCH, 0.05, "rsqrt", 0.1)},
    "lra_table1/image": {
        **steps(CIFAR_BASE, 256, 35000, 175, 175), **sizes(CIFAR_BASE, 1, 32, 1, 32, 64),
        **cite(CIFAR_BASE, model__pooling="cls", model__position_embedding="learned", model__dropout=0.3),
        **schedule(CIFAR_BASE, 0.0005, "cosine", 0.0)},
    "lra_table1/pathfinder": {
        **steps(PF_BASE, 512, 62400, 312, 312), **sizes(PF_BASE, 1, 32, 2, 16, 32),
        **cite(f"{PF_BASE} classifier_pool MEAN: common_layers.classifier_head's mean of the unmasked output",
               model__pooling="mean_unmasked"),
        **cite(PF_BASE, model__position_embedding="sinusoidal", model__dropout=0.1),
        **schedule(PF_BASE, 0.001, "cosine", 0.0)},
}
# The learning-to-hash table: A.5's model and schedule, the rest from the LRA code; the learning rate is
# the peak the LRA code's own schedule reaches (0.05 / √warm-up for its rsqrt tasks).
PEAK = "the peak of the LRA code's 0.05 × linear_warmup × rsqrt_decay: 0.05 / √warmup"
for task, (source, length, batch, every, dim, ff, heads, qkv, dropout, positions, lr, wd) in {
        "listops": (f"{LRA}/listops/configs/base_listops_config.py", 2000, 32, 50, 256, 1024, 8, 256, 0.1,
                    "sinusoidal", 0.0015811, 0.1),
        "text": (TC, 1000, 32, 100, 256, 1024, 4, 256, 0.1, "sinusoidal", 0.00055902, 0.1),
        "retrieval": (MATCH, 4000, 32, 100, 128, 512, 4, 128, 0.1, "sinusoidal", 0.00055902, 0.1),
        "image": (f"{CIFAR}/transformer_base.py over base_cifar10_config.py", None, 256, 175, 128, 64, 8, 64, 0.3,
                  "learned", 0.0005, 0.0)}.items():
    SETUPS[f"lha_table3/{task}"] = {
        **cite(LHA_A5, model__num_layers=4, model__dim=dim, model__ff_dim=ff, model__classifier_dim=ff,
               task__max_steps=20000, task__warmup_steps=2000, trainer__lr_schedule="cosine"),
        **cite(source, task__batch_size=batch, task__eval_every=every, model__num_heads=heads,
               model__dropout=dropout, model__pooling="cls", model__position_embedding=positions,
               trainer__weight_decay=wd),
        **({"task.max_length": (length, source)} if length else {}),
        "model.head_dim": (qkv // heads, f"{source}: qkv_dim {qkv} (= the hidden size but Image's) over {heads} heads"),
        "trainer.lr": (lr, PEAK if task != "image" else source),
        **cite(ADAM, trainer__beta2=0.98, trainer__eps=1e-9)}

# Each row's attention, whatever the task.
ROWS = {
    "lra_table1/transformer": cite(f"{LRA}/models/transformer", attention__name="softmax"),
    "lra_table1/local": {
        **cite(f"{LRA}/models/local", attention__name="local"),
        **cite(f"{LRA}/models/local/local_attention.py:318 jnp.reshape(query, (bs, block_size, num_query_blocks, "
               "num_heads, head_dim)): slot a of group g is position a·G + g", attention__grouping="strided")},
    "lra_table1/sparse_transformer": {
        **cite(f"{LRA}/models/sparse_transformer", attention__name="sparse_transformer"),
        **cite(f"{LRA}/utils/train_utils.py: Fixed1Pattern(block_size=50), Fixed2Pattern(block_size=50, c=10)",
               attention__block_size=50, attention__summary_size=10)},
    "lra_table1/longformer": cite(f"{LRA}/models/longformer/longformer.py sliding_window_size=512, global_mask=None",
                                  attention__name="longformer", attention__window_size=512,
                                  attention__num_global_tokens=0),
    "lra_table1/linformer": {
        **cite(f"{LRA}/models/linformer/linformer_attention.py low_rank_features=16, one lr_kernel for K and V "
               "(text's config sets low_rank_features at its top level, which train.py never reads)",
               attention__name="linformer", attention__proj_dim=16, attention__share_kv=True),
        **cite(f"{LRA}/models/linformer/linformer_attention.py: a kernel per layer", attention__share_across_layers=False)},
    "lra_table1/reformer": cite(f"{LRA}/models/reformer/reformer_attention.py n_hashes=1", attention__name="reformer",
                                attention__num_hashes=1),
    "lra_table1/sinkhorn": cite(f"{LRA}/models/sinkhorn_transformer", attention__name="sinkhorn"),
    "lra_table1/synthesizer": cite(
        f"{LRA}/models/synthesizer/synthesizer.py SynthesizerEncoder synthesizer_mode='random', "
        "ignore_dot_product=False (text's config sets others at its top level, which train.py never reads)",
        attention__name="synthesizer", attention__mode="random", attention__dot_product=True),
    "lra_table1/bigbird": cite(f"{LRA}/models/bigbird/bigbird_attention.py num_rand_blocks=3", attention__name="bigbird",
                               attention__num_random_blocks=3),
    "lra_table1/linear_transformer": cite(f"{LRA}/models/linear_transformer", attention__name="linear_transformer"),
    "lra_table1/performer": cite(f"{LRA}/models/performer", attention__name="performer"),
    "lha_table3/rfa": cite("the RFA paper's LRA runs (Peng et al., ICLR 2021), which the table quotes",
                           attention__name="rfa"),
    "lha_table3/lha": {**cite(f"{LHA_A5}: LHA/local hybrid, variant (d)", attention__name="learned_hash"),
                       **cite(f"{LHA_A5}: λ", attention__aux_loss_weight=0.05)},
}

# What the LRA code changes per row and task (conf/row/<table>/<row>/<task>.yaml).
DROPOUT_ROWS = ("transformer", "local", "sparse_transformer", "sinkhorn", "synthesizer", "bigbird")
ATTENTION_DROPOUT = {"listops": (0.1, f"{ENCODERS}: attention_dropout_rate=0.1"),
                     "text": (0.1, f"{ENCODERS}: attention_dropout_rate=0.1"),
                     "retrieval": (0.1, f"{ENCODERS}: attention_dropout_rate=0.1"),
                     "image": (0.2, f"{CIFAR_BASE} attention_dropout_rate"),
                     "pathfinder": (0.1, f"{PF_BASE} attention_dropout_rate")}
ROW_TASKS = {(f"lra_table1/{row}", task): {"attention.dropout": ATTENTION_DROPOUT[task]}
             for row in DROPOUT_ROWS for task in TASKS}


def per_task(row: str, task: str, **values) -> None:
    ROW_TASKS.setdefault((f"lra_table1/{row}", task), {}).update(values)


for row, (layers, dim, heads, qkv, mlp, extra) in {
        "transformer": (1, 128, 8, 64, 128, {}),
        "bigbird": (1, 128, 4, 64, 128, {"attention.block_size": 64}),
        "linear_transformer": (1, 128, 8, 64, 128, {}),
        "linformer": (1, 128, 8, 64, 128, {}),
        "local": (1, 128, 2, 64, 128, {"attention.block_size": 64, "model.pooling": "mean_unmasked"}),
        "longformer": (4, 128, 4, 64, 128, {"model.pooling": "mean_unmasked"}),
        "performer": (1, 128, 8, 64, 128, {}),
        "reformer": (4, 64, 8, 32, 64, {}),
        "sparse_transformer": (1, 128, 8, 64, 128, {}),
        "synthesizer": (1, 128, 8, 64, 128, {"attention.mode": "random"})}.items():
    source = f"{CIFAR}/{row}_base.py" + (" (num_head = 4: the evident num_heads, which the encoder would otherwise "
                                          "refuse as an unknown keyword)" if row == "bigbird" else "")
    per_task(row, "image", **sizes(source, layers, dim, heads, qkv, mlp), **{k: (v, source) for k, v in extra.items()})
SINKHORN_MEAN = (f"{LRA}/models/sinkhorn_transformer/sinkhorn_transformer.py: SinkhornTransformerEncoder pools only by "
                 "'MEAN' (another classifier_pool raises)")
per_task("sinkhorn", "image", **cite(f"{CIFAR}/sinkhorn_base.py", model__num_layers=1, model__dropout=0.1,
                                     trainer__weight_decay=0.7, attention__block_size=64),
         **cite(SINKHORN_MEAN, model__pooling="mean_unmasked"))
per_task("sinkhorn", "text", **cite(SINKHORN_MEAN, model__pooling="mean_unmasked"))
for row, (layers, dim, heads, qkv, mlp, dropout, extra) in {
        "transformer": (4, 32, 4, 16, 32, 0.2, {}),
        "bigbird": (4, 64, 2, 32, 64, 0.2, {"attention.block_size": 64}),
        "linear_transformer": (1, 128, 2, 64, 128, 0.2, {}),
        "linformer": (1, 32, 2, 16, 32, 0.2, {}),
        "local": (2, 64, 4, 32, 64, 0.1, {"attention.block_size": 64}),
        "longformer": (2, 32, 2, 16, 32, 0.1, {}),
        "performer": (4, 32, 8, 16, 32, 0.2, {}),
        "reformer": (2, 64, 8, 32, 64, 0.2, {}),
        "sinkhorn": (2, 32, 4, 16, 64, 0.2, {"attention.block_size": 64}),
        "sparse_transformer": (1, 32, 8, 16, 32, 0.2, {}),
        "synthesizer": (2, 64, 4, 32, 64, 0.2, {"attention.mode": "random"})}.items():
    source = f"{PF}/{row}_base.py"
    per_task(row, "pathfinder", **sizes(source, layers, dim, heads, qkv, mlp), **{"model.dropout": (dropout, source)},
             **{k: (v, source) for k, v in extra.items()})
per_task("sparse_transformer", "pathfinder", **cite(
    f"{LRA}/models/sparse_transformer/sparse_transformer.py:159-161 use_cls_token only when classifier_pool == 'CLS'; "
    f"{PF_BASE} pools by MEAN", attention__cls_token=False))
per_task("performer", "listops", **cite(f"{LRA}/listops/configs/performer_base.py model_kwargs: softmax FAVOR+, "
                                        "nb_features=2; make_fast_softmax_attention numerical_stabilizer=1e-6, "
                                        "redraw_features=True", attention__num_features=2,
                                        attention__feature_epsilon=1e-6, attention__redraw_interval=1))
per_task("sinkhorn", "listops", **cite(f"{LRA}/listops/train.py passes no classifier_pool: "
                                       "SinkhornTransformerEncoder's default MEAN", model__pooling="mean_unmasked"))
LHA_CODE = "Edward-Sun/Learning-to-Hash-Attention (36f9ee3) lha_transformer.py"
for task, local in (("listops", 4), ("text", 2), ("retrieval", 2), ("image", 4)):
    rate, source = ATTENTION_DROPOUT[task]
    ROW_TASKS[("lha_table3/lha", task)] = {
        "attention.local_heads": (local, f"{LHA_A5}: variant (d), LHA heads beside local ones; half of each (ours)"),
        "attention.dropout": (rate, f"{LHA_CODE}: attention_dropout_rate on both kinds of head, as {source}")}

# What the cited code does that our backends cannot express: each row's entry in docs/attention.md
# ("Paper presets and the configurations they cite") must name it.
DEVIATIONS = {
    "lra_table1/performer": "ReLU(x) + 0.001",
    "lra_table1/reformer": "n/10-long chunks",
    "lra_table1/longformer": "255 keys before it",
    "lra_table1/linformer": "attention-probability dropout",
    "lra_table1/sinkhorn": "one Dense layer",
}

# Rows of each table (the experiment's sweep), and the paper each compares with.
TABLE_ROWS = {
    "lra_table1": [f"lra_table1/{row}" for row in ("transformer", "local", "sparse_transformer", "longformer",
                                                   "linformer", "reformer", "sinkhorn", "synthesizer", "bigbird",
                                                   "linear_transformer", "performer")],
    "lha_table3": [f"lra_table1/{row}" for row in ("transformer", "linformer", "reformer", "sparse_transformer",
                                                   "sinkhorn", "synthesizer", "bigbird", "linear_transformer",
                                                   "performer")] + ["lha_table3/rfa", "lha_table3/lha"],
}
TABLE_TASKS = {"lra_table1": TASKS, "lha_table3": LHA_TASKS}
REFERENCE = {"lra_table1": "lra", "lha_table3": "lha"}


def expected(table: str, row: str, task: str) -> dict:
    """Every cited value of one composed preset. LRA Table 1: the task's setup, then the row's own
    (per task where the LRA code changes it). The learning-to-hash table: A.5's setup over every model
    and trainer value, but the row's attention options and pooling (per task too: the LRA code's
    Sinkhorn encoder pools by the mean, which no setup can change)."""
    setup = {**ENCODER, **SETUPS[f"{table}/{task}"]}
    row_task = ROW_TASKS.get((row, task), {})
    if table == "lra_table1":
        return {**setup, **ROWS[row], **row_task}
    carried = {k: v for k, v in row_task.items() if k.startswith("attention.") or k == "model.pooling"}
    return {**ROWS[row], **setup, **carried}
