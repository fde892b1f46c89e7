"""Every task × attention preset composes; the implemented ones build a model and take a step.
Bad input ends with one line that names the fix, and never with a record claiming success."""

import itertools
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

import attention_zoo
from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from helpers import compose_config
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.model import Classifier
from lra.validation import attention_spec

register_configs()
register_resolvers()

TASKS = sorted(p.stem for p in (CONF_DIR / "task").glob("*.yaml"))
ATTENTIONS = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))


def test_the_contract_presets_exist():
    assert TASKS == sorted(["listops", "text", "retrieval", "image", "pathfinder"])
    assert set(ATTENTIONS) == {"softmax", "none", "yoso", "yoso_e", "yoso_c", "nystrom", "linformer",
                               "performer", "reformer", "longformer", "lsh", "learned_hash",
                               # the rest of LRA Table 1 and the learning-to-hash table
                               "local", "sparse_transformer", "sinkhorn", "synthesizer", "bigbird",
                               "linear_transformer", "rfa"}
    assert set(attention_zoo.names()) <= set(ATTENTIONS), "every registered backend needs a preset"


@pytest.mark.parametrize("task,attention", list(itertools.product(TASKS, ATTENTIONS)))
def test_every_task_and_attention_preset_composes(task, attention):
    for trainer in ("default", "smoke"):
        cfg = compose_config(f"task={task}", f"attention={attention}", f"trainer={trainer}")
        resolved = OmegaConf.to_container(cfg, resolve=True)
        assert resolved["task"]["name"] == task and resolved["attention"]["name"] == attention
        for key in ("max_steps", "eval_every", "checkpoint_every", "batch_size"):
            assert isinstance(resolved["trainer"][key], int)
    if attention not in attention_zoo.names():
        return
    # Code exists: build the model and take an optimizer step on inputs of the task's shape (smoke).
    length = min(cfg.task.max_length, cfg.trainer.max_length)
    torch.manual_seed(0)
    model = Classifier(cfg.model, cfg.task, attention_spec(cfg), length)
    documents = 2 if cfg.task.dual_encoder else 1
    ids = [torch.randint(1, cfg.task.vocab_size, (2, length)) for _ in range(documents)]
    masks = [torch.arange(length)[None] < torch.tensor([[length], [length // 2]]) for _ in range(documents)]
    loss = torch.nn.functional.cross_entropy(model(ids, masks), torch.tensor([0, 1]))
    loss.backward()
    torch.optim.AdamW(model.parameters()).step()
    assert torch.isfinite(loss)


def test_task_presets_carry_the_reference_schedule():
    expected = {  # docs/reference-setup.md: batch, steps, warm-up, eval every, length
        "listops": (32, 5000, 1000, 50, 2048), "text": (32, 20000, 8000, 500, 4096),
        "retrieval": (32, 30000, 800, 300, 4096), "image": (256, 35000, 175, 175, 1024),
        "pathfinder": (256, 62400, 312, 312, 1024),
    }
    for task, (batch, steps, warmup, every, length) in expected.items():
        t = compose_config(f"task={task}").trainer
        assert (t.batch_size, t.max_steps, t.warmup_steps, t.eval_every) == (batch, steps, warmup, every)
        assert compose_config(f"task={task}").task.max_length == length
    smoke = compose_config("trainer=smoke").trainer
    assert smoke.max_steps <= 20 and smoke.train_subset and smoke.eval_subset


def test_masked_mean_pooling_ignores_padding_and_the_reference_option_does_not():
    cfg = compose_config("attention=softmax")
    torch.manual_seed(0)
    model = Classifier(cfg.model, cfg.task, attention_zoo.spec("softmax"), 64).eval()
    ids = torch.randint(2, 17, (1, 64))
    short, long = torch.arange(64)[None] < 20, torch.arange(64)[None] < 20
    other = ids.clone()
    other[:, 20:] = 5  # padded positions hold other tokens
    torch.testing.assert_close(model([ids], [short]), model([other], [long]))
    cfg.model.pooling = "mean_unmasked"
    torch.manual_seed(0)
    reference = Classifier(cfg.model, cfg.task, attention_zoo.spec("softmax"), 64).eval()
    assert not torch.allclose(reference([ids], [short]), reference([other], [long]))


def test_the_reference_masking_quirk_treats_every_zero_id_as_padding():
    """model.padding_mask=nonzero_ids (the reference's `ids != 0`) equals the default length mask
    with every id-0 position (a black pixel) marked as padding; the default keeps them."""
    cfg = compose_config("task=image", "attention=softmax")
    ids = torch.randint(1, 256, (2, 64))
    ids[0, ::3] = 0
    ids[1, 10:30] = 0
    lengths = torch.ones(2, 64, dtype=torch.bool)
    torch.manual_seed(0)
    default = Classifier(cfg.model, cfg.task, attention_zoo.spec("softmax"), 64).eval()
    cfg.model.padding_mask = "nonzero_ids"
    torch.manual_seed(0)
    quirk = Classifier(cfg.model, cfg.task, attention_zoo.spec("softmax"), 64).eval()
    torch.testing.assert_close(quirk([ids], [lengths]), default([ids], [ids != 0]))
    assert not torch.allclose(quirk([ids], [lengths]), default([ids], [lengths]))


# ---------------------------------------------------------------- bad input, through the real command


@pytest.mark.parametrize("override,expected", [
    ("attention=sofmax", "unknown choice 'sofmax' for attention (did you mean 'softmax'?); valid: "),
    ("trainer.max_step=10", "unknown key 'trainer.max_step' (did you mean 'max_steps'?); valid keys under trainer: "),
    ("model.pooling=max", "invalid value for model.pooling"),
    ("resume=/nonexistent/run", "is not an lra-train run directory"),
])
def test_config_mistakes_end_with_one_line_naming_the_fix(tmp_path, data_dir, override, expected):
    result = run_command(["lra-train", override], tmp_path, data_dir, check=False)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected in last, result.stderr
    assert "Traceback" not in result.stderr
    assert not run_dirs(tmp_path)


def test_unwritable_data_dir_fails_cleanly(tmp_path):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    result = run_command(["lra-train", "trainer=smoke", f"data_dir={blocked}/data"], tmp_path, tmp_path, check=False)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the data directory") and "set data_dir=" in last
    (run,) = run_dirs(tmp_path)
    assert read_json(run / "metrics.json")["status"] == "failed"


def test_truncated_cache_fails_cleanly_and_records_failure(tmp_path, data_dir):
    args = ["lra-train", "trainer=smoke", "trainer.max_steps=2", *SMALL_LISTOPS, f"data_dir={tmp_path / 'data'}"]
    run_command(args, tmp_path, data_dir)
    (tokens,) = (tmp_path / "data").rglob("train.tokens0.npy")
    tokens.write_bytes(tokens.read_bytes()[: tokens.stat().st_size // 2])
    result = run_command(args, tmp_path, data_dir, check=False)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "is damaged" in last and "rebuild it with: rm -r" in last
    statuses = sorted(read_json(r / "metrics.json")["status"] for r in run_dirs(tmp_path))
    assert statuses == ["completed", "failed"]


def test_a_preset_without_code_fails_with_the_implemented_list(tmp_path, data_dir):
    missing = sorted(set(ATTENTIONS) - set(attention_zoo.names()))
    if not missing:
        pytest.skip("every preset has code")
    result = run_command(["lra-train", "trainer=smoke", f"attention={missing[0]}"], tmp_path, data_dir, check=False)
    assert result.returncode == 1 and "implemented: " in result.stderr.strip().splitlines()[-1]
    (run,) = run_dirs(tmp_path)
    assert read_json(run / "metrics.json")["status"] == "failed"


def test_the_schemas_import_in_one_direction():
    """lra.config (lra-train's schemas, and the registry of all) imports lra.tool_configs (lra-profile's
    and lra-fidelity's); both take what they share from lra.config_fields, which imports neither."""
    probe = ("import sys, importlib; importlib.import_module(sys.argv[1]); "
             "print(sorted(m for m in ('lra.config', 'lra.tool_configs') if m in sys.modules))")
    imported = {module: subprocess.run([sys.executable, "-c", probe, module], capture_output=True, text=True,
                                       check=True).stdout.strip()
                for module in ("lra.config_fields", "lra.tool_configs")}
    assert imported == {"lra.config_fields": "[]", "lra.tool_configs": "['lra.tool_configs']"}


def test_composes_share_the_config_store_and_never_change_it():
    """Hydra copies its ConfigStore for every compose unless told not to (lra.config.register_configs: 30 of a
    compose's 130 ms); the store hands out copies of its nodes, so a composed config changed in place leaves
    the next compose as it was."""
    import copy

    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    assert copy.deepcopy(store) is store
    first = compose_config("attention=yoso", "trainer=smoke")
    first.attention.num_hashes, first.trainer.lr = 999, 123.0
    again = compose_config("attention=yoso", "trainer=smoke")
    assert again.attention.num_hashes != 999 and again.trainer.lr != 123.0
    assert OmegaConf.to_container(again) == OmegaConf.to_container(compose_config("attention=yoso", "trainer=smoke"))
