"""Self-pretraining's refusals of settings that would train otherwise than they say: a causal language model
over an attention that reads later padding, a batch torchrun's processes cannot split, stage-1 settings beside
``pretrain.from``."""

from __future__ import annotations

import pytest
import torch

import attention_zoo
from conftest import SMALL_LISTOPS, run_command
from helpers import compose_config
from lra.errors import ConfigError
from lra.validation import validate


def test_a_causal_language_model_refuses_strided_local_attention_which_reads_later_padding():
    """Strided Local (the LRA code's grouping, LRA Table 1's row) gives slot a of group g the mask bits of
    positions g·b + a′, later ones among them: a causal model trained with it learned where each sequence
    ends. Its causal mode stays (it is the LRA code's), but pretrain=causal refuses it in one line."""
    backend = attention_zoo.build("local", num_heads=1, head_dim=4, max_seq_len=12, causal=True, block_size=4,
                                  grouping="strided").eval()
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 12, 4, generator=generator) for _ in range(3))
    mask, shorter = torch.ones(1, 12, dtype=torch.bool), torch.ones(1, 12, dtype=torch.bool)
    shorter[0, 9:] = False
    assert not torch.equal(backend(q, k, v, mask)[:, :, :9], backend(q, k, v, shorter)[:, :, :9])  # the leak
    with pytest.raises(ConfigError) as refused:
        validate(compose_config("attention=local", "attention.grouping=strided", "pretrain=causal", *SMALL_LISTOPS))
    assert str(refused.value) == (
        "pretrain=causal cannot use attention=local as set: grouping=strided reads the padding mask of later positions "
        "(the LRA code's reshape), so a position would learn where its sequence ends; use attention.grouping=contiguous "
        "(or pretrain=masked)")
    validate(compose_config("attention=local", "attention.grouping=contiguous", "pretrain=causal", *SMALL_LISTOPS))


@pytest.mark.parametrize("overrides, key", [(["trainer.batch_size=6"], "trainer.batch_size"),
                                            (["pretrain=masked", "pretrain.batch_size=6"], "pretrain.batch_size")])
def test_under_torchrun_a_batch_the_processes_cannot_split_is_refused_naming_its_own_key(monkeypatch, overrides, key):
    """It was refused only once the run's folder held a failed record, and for the pretraining batch as
    trainer.batch_size, which divided evenly."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "localhost"), ("MASTER_PORT", "1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        validate(compose_config("trainer.batch_size=4", "trainer.grad_accumulation=2", *overrides, *SMALL_LISTOPS))
    batch = overrides[-1].split("=")[1]
    assert str(refused.value) == (f"invalid value for {key}: {batch}; under torchrun it must be a multiple of "
                                  f"trainer.grad_accumulation=2 × 2 processes = 4: pass {key}=<such a value>, or "
                                  "another --nproc_per_node")
    validate(compose_config("trainer.batch_size=8", "trainer.grad_accumulation=2", "pretrain=masked",
                            "pretrain.batch_size=4", *SMALL_LISTOPS))


def test_a_stage_1_setting_beside_pretrain_from_is_refused_as_changing_nothing(tmp_path, data_dir):
    """It was taken silently: the stage 1 had run in the other run, and this run's saved config (and the
    table's row name) said pretrain.max_steps=50."""
    result = run_command(["lra-train", "pretrain.from=elsewhere", "pretrain.max_steps=50", "trainer=smoke"], tmp_path,
                         data_dir, check=False)
    assert result.returncode == 2 and result.stderr.strip() == (
        "error: pretrain.max_steps changes nothing beside pretrain.from, whose stage 1 ran as it was set there (its "
        "run's .hydra/resolved.yaml): leave pretrain.max_steps out"), result.stderr
    assert not (tmp_path / "runs").exists()
