"""Efficient-attention backends behind one API, usable without the ``lra`` harness.

>>> import attention_zoo
>>> attn = attention_zoo.build("softmax", num_heads=2, head_dim=32, max_seq_len=2048)
>>> out = attn(q, k, v, mask)   # [batch, heads, n, head_dim]; mask [batch, n], True = real token
"""

from attention_zoo.registry import (Attention, AttentionSpec, Backend, BackendError, build, causal_names, engines, get,
                                    label, make_options, names, pin_engines, register, spec)

# Importing a backend module registers it.
from attention_zoo import bigbird, learned_hash, linear_transformer, linformer, local, longformer, lsh, none, nystrom, performer, reformer, rfa, sinkhorn, softmax, sparse_transformer, synthesizer, yoso, yoso_e  # noqa: E402,F401

# Then the user's own, outside the package (LRA_ATTENTION_MODULES): a failure is raised at the registry's next use.
from attention_zoo.user_modules import UserModuleError, check as check_user_modules, load as _load_user_modules  # noqa: E402

_load_user_modules()

__all__ = ["Attention", "AttentionSpec", "Backend", "BackendError", "UserModuleError", "build", "causal_names",
           "check_user_modules", "get", "label", "make_options", "names", "register", "spec"]
