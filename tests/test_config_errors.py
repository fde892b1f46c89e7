"""Bad config values: every invalid value is one line naming the field, the value and the rule, a
non-zero exit, no default substituted, and no run record claiming a success."""

import itertools

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from helpers import compose_config
from lra.config import CONF_DIR
from lra.errors import ConfigError
from lra.commands.command_line import check_presets_against_choices
from lra.validation import check_group_names, check_preset_choices, validate

# One case per kind of rule: (overrides, the field the error names, words of the rule).
BAD_CONFIGS = [
    (["trainer.grad_clip=-1"], "trainer.grad_clip", "(0, ∞)"),  # would flip the gradient
    (["trainer.lr=nan"], "trainer.lr", "finite"),
    (["trainer.beta1=1.5"], "trainer.beta1", "[0, 1)"),
    (["trainer.eps=0"], "trainer.eps", "(0, ∞)"),
    # AdamW's float32 arithmetic: the training ended in an overflow "bug" line, or a divergence blamed on trainer.lr
    # accepted and ignored: the generator's data trained, the compiler never ran, the schedule had no such factor
    (["task.source=generate", "task.path=/data/listops"], "task.path", "null with source=generate (the generator reads "
                                                                        "no files): leave it out, or pass task.source=<lra_release>"),
    (["trainer.compile_mode=max-autotune"], "trainer.compile_mode", "default with compile=false"),
    (["trainer.lr_schedule=rsqrt", "trainer.lr_end_factor=0.1"], "trainer.lr_end_factor", "left out: it shapes only "
                                                                  "trainer.lr_schedule=linear, and this run's is rsqrt"),
    (["task=pathfinder", "task.resolution=33", "task.max_length=1089"], "task.resolution", "one of 32, 64, 128"),
    (["trainer.eps=1e-40"], "trainer.eps", "at least 1.18e-38, float32's smallest normal number"),
    (["trainer.lr=1e38"], "trainer.lr", "AdamW's largest step, lr × max(1, lr_start_factor, lr_end_factor) / (1 − beta1), "
                                        "is a float32 number"),
    (["trainer.lr_start_factor=1e300"], "trainer.lr_start_factor", "is a float32 number (≤ 3.4e+38)"),
    (["trainer.weight_decay=1e300"], "trainer.weight_decay", "at most 1 / (lr × max(1, lr_start_factor, lr_end_factor)) "
                                                             "= 1e+04: AdamW multiplies each weight by 1 − rate"),
    (["pretrain=masked", "pretrain.lr=1e300"], "pretrain.lr", "AdamW's largest step, pretrain.lr × max(1"),
    (["trainer.max_steps=0"], "trainer.max_steps", "≥ 1"),
    (["trainer.batch_size=0"], "trainer.batch_size", "≥ 1"),
    (["trainer.eval_every=0"], "trainer.eval_every", "≥ 1"),
    (["trainer.checkpoint_every=0"], "trainer.checkpoint_every", "≥ 1"),
    (["trainer.log_every=0"], "trainer.log_every", "≥ 1"),
    (["trainer.grad_accumulation=0"], "trainer.grad_accumulation", "≥ 1"),
    (["trainer.grad_accumulation=3"], "trainer.batch_size", "multiple of grad_accumulation=3"),
    (["trainer.eval_subset=0"], "trainer.eval_subset", "≥ 1 (or null)"),
    (["trainer.max_length=0"], "trainer.max_length", "≥ 1 (or null)"),  # was silently the task's length
    (["trainer.eval_batch_size=0"], "trainer.eval_batch_size", "≥ 1 (or null)"),
    (["trainer.warmup_steps=-1"], "trainer.warmup_steps", "≥ 0"),
    (["trainer.device=gpu"], "trainer.device", "auto, cpu, cuda or cuda:N"),
    (["seed=-1"], "seed", "between 0 and 2^32"),
    (["optimized_metric=accuracy"], "optimized_metric", "one of best_val_accuracy, test_accuracy"),
    (["model.num_heads=0"], "model.num_heads", "≥ 1"),  # trained a model without attention
    (["model.head_dim=0"], "model.head_dim", "≥ 1"),
    (["model.num_layers=0"], "model.num_layers", "≥ 1"),
    (["model.dropout=1.5"], "model.dropout", "[0, 1)"),
    (["task.num_classes=1"], "task.num_classes", "10, the classes of listops's labels: leave it out"),
    (["task.num_classes=12"], "task.num_classes", "10, the classes of listops's labels"),  # 2 outputs no label has
    (["task=text", "task.num_classes=3"], "task.num_classes", "2, the classes of text's labels"),
    (["task=text", "task.source=aclimdbb"], "task.source", "one of tfds, aclimdb"),
    (["task.vocab_size=5"], "task.vocab_size", "≥ 17"),
    (["task.generator.max_length=5"], "task.generator.max_length", "≥ 502"),  # looped forever
    (["task.generator.num_train=0"], "task.generator.num_train", "≥ 1"),
    (["task.generator.num_test=0"], "task.generator.num_test", "≥ 1"),
    (["task=pathfinder", "task.max_length=100"], "task.max_length", "resolution² = 1024"),
    (["task=image", "task.max_length=512"], "task.max_length", "at least the 1024 pixels of each image of task=image"),
    (["task=pathfinder", "task.generator.num_images=3"], "task.generator.num_images", "≥ 10"),
    (["task=text", "task.document_bytes=0"], "task.document_bytes", "≥ 1 (or null)"),
    (["attention=yoso", "attention.hash_code_len=0"], "attention.hash_code_len", "between 1 and 20"),  # was the default τ
    (["attention=yoso", "attention.hash_code_len=40"], "attention.hash_code_len", "between 1 and 20"),
    (["attention=yoso", "attention.num_hashes=0"], "attention.num_hashes", "≥ 1"),
    (["attention=yoso", "attention.backward=exat"], "attention.backward", "one of lower_bound"),
    (["attention=yoso_c", "attention.conv_window=4"], "attention.conv_window", "odd"),
    (["attention=reformer", "attention.num_hashes=0"], "attention.num_hashes", "≥ 1"),
    (["attention=reformer", "attention.num_buckets=3"], "attention.num_buckets", "even"),
    (["attention=lsh", "attention.num_buckets=3"], "attention.num_buckets", "even (argmax over ±rotations) or 1"),
    (["task=retrieval", "task.dual_encoder=false"], "task.dual_encoder", "true for retrieval"),
    (["task.dual_encoder=true"], "task.dual_encoder", "false for listops"),
    (["attention=performer", "attention.feature_epsilon=-1"], "attention.feature_epsilon", "[0, ∞)"),
    (["attention=softmax", "attention.dropout=1.0"], "attention.dropout", "[0, 1)"),
    (["attention=learned_hash", "attention.local_window=1"], "attention.local_window", "≥ 2"),
    (["logger=wandb", "logger.project=''"], "logger.project", "W&B project name"),
    # W&B's own limits: wandb.init failed, and the run trained unlogged behind a warning
    (["logger=wandb", "logger.project=me/lra"], "logger.project", "none of / \\ # ? % :"),
    (["logger=wandb", "logger.project=" + "p" * 129], "logger.project", "1 to 128 characters"),
    (["logger=wandb", "logger.tags=[ok," + "t" * 65 + "]"], "logger.tags", "each 1 to 64 characters"),
    (["logger=wandb", "logger.entity=''"], "logger.entity", "not blank (or null)"),
    (["logger=wandb", "logger.group=" + "g" * 129], "logger.group", "1 to 128 characters"),
    # cross-field rules and the backends' shape constraints, checked before anything is built
    (["trainer.max_steps=100", "trainer.warmup_steps=500"], "trainer.warmup_steps", "at most max_steps=100"),  # lr never peaked
    (["trainer.lr_schedule=cosine", "trainer.max_steps=100", "trainer.warmup_steps=101"], "trainer.warmup_steps", "at most max_steps"),
    (["trainer=smoke", "trainer.train_subset=2"], "trainer.train_subset", "at least one batch (batch_size=4)"),
    (["attention=nystrom", "attention.num_landmarks=5000"], "attention.num_landmarks", "at most the input length 2048"),  # hung
    (["attention=nystrom", "attention.landmarks=padded_segments", "attention.num_landmarks=3"], "attention.num_landmarks",
     "a divisor of the input length 2048"),  # was a traceback at the first step
    (["attention=nystrom", "attention.landmarks=padded_segments", "attention.num_landmarks=256", "task.max_length=256",
      "model.pooling=cls"], "attention.num_landmarks", "a divisor of the input length 257"),  # the CLS token counts
    (["attention=learned_hash", "attention.local_heads=3"], "attention.local_heads", "between 0 and num_heads=2"),
    (["attention=learned_hash", "attention.membership=argmax"], "attention.membership", "one of softmax, raw"),
    (["trainer.device=cpu", "trainer.precision=bf16"], "trainer.precision", "needs a CUDA device"),  # left a failed folder
    (["pretrain=masked", "pretrain.mask_probability=0"], "pretrain.mask_probability", "(0, 1]"),  # nothing to predict
    (["pretrain=masked", "pretrain.mask_probability=1.5"], "pretrain.mask_probability", "(0, 1]"),
    (["pretrain=masked", "pretrain.max_steps=0"], "pretrain.max_steps", "≥ 1"),
    (["pretrain=masked", "pretrain.lr=0"], "pretrain.lr", "(0, ∞)"),
    (["pretrain=causal", "pretrain.max_steps=10", "pretrain.warmup_steps=20"], "pretrain.warmup_steps", "at most max_steps=10"),
    (["pretrain=masked", "trainer.grad_accumulation=2", "pretrain.batch_size=3"], "pretrain.batch_size", "multiple of"),
    (["pretrain=masked", "trainer=smoke", "pretrain.batch_size=128"], "pretrain.batch_size", "at most trainer.train_subset"),
]


@pytest.mark.parametrize("overrides,field,rule", BAD_CONFIGS, ids=[" ".join(c[0]) for c in BAD_CONFIGS])
def test_every_invalid_value_is_one_line_naming_field_value_and_rule(overrides, field, rule):
    cfg = compose_config(*overrides)
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    message = str(error.value)
    assert message.startswith(f"invalid value for {field}: ") and rule in message and "\n" not in message
    assert f"pass {field}=" in message or "leave it out" in message, "the line names the fix"


@pytest.mark.parametrize("device,impl", [("cpu", "cuda"), ("auto", "cpu"), ("cuda:0", "cpu")])
def test_yoso_kernels_for_another_device_than_the_runs_are_one_line(monkeypatch, device, impl):
    """On a CUDA machine (stood in for): the run's first forward had raised the backend's ValueError, after the
    run folder and its data were made."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError) as error:
        validate(compose_config("attention=yoso", f"attention.impl={impl}", f"trainer.device={device}"))
    kind = "cpu" if device == "cpu" else "cuda"
    assert str(error.value) == (f"invalid value for attention.impl: '{impl}'; this run is on {kind} (trainer.device="
                                f"{device}) and these kernels are for {impl}: pass attention.impl={kind} (or auto)")
    validate(compose_config("attention=yoso", f"attention.impl={kind}", f"trainer.device={device}"))


def test_every_preset_and_default_is_valid():
    for overrides in ([], ["task=pathfinder"], ["task=text"], ["task=retrieval"], ["task=image"],
                      ["trainer=smoke"], ["logger=wandb"], ["experiment=quickstart"], ["pretrain=masked"],
                      ["pretrain=causal"], ["experiment=spt"], ["task=retrieval", "pretrain=masked"]):
        validate(compose_config(*overrides))


@pytest.mark.parametrize("args,expected", [
    (["trainer.grad_clip=-1"], "invalid value for trainer.grad_clip: -1.0"),
    (["+trainer.max_step=10"], "unknown key 'trainer.max_step' (did you mean 'max_steps'?); valid keys under trainer: "),
    (["seeed=1"], "unknown key 'seeed' (did you mean 'seed'?); valid keys at the top level: attention, data_dir"),
    (["attention=yoso", "attention.impl=cuda"], "attention.impl=cuda but this machine has no CUDA device"),
    (["trainer.device=cuda"], "trainer.device=cuda but this machine has no CUDA device"),  # left a failed run folder
    (["trainer.device=cpu", "trainer.precision=fp16"], "invalid value for trainer.precision: 'fp16'"),  # the same
    (["~model"], "the config has no model (was it deleted with ~model?)"),  # was a traceback
    (["pretrain=causal", "attention=yoso"], "pretrain=causal needs causal attention and attention=yoso has no causal mode"),
    (["pretrain.from=no/such/run"], "pretrain.from=no/such/run is not a folder"),
    (["+pretrain.frm=runs/x"], "unknown key 'pretrain.frm' (did you mean 'from'?)"),
    # A config group given no choice or several, and a config folder that is not there, were tracebacks deep
    # in Hydra's composition (or a line cut after "while composing config:").
    (["task=null"], "task=null: a config group takes one of its choices, not null; pass task=<choice>"),
    (["+model=null"], "model=null: a config group takes one of its choices, not null"),
    (["hydra/launcher=joblib"], "hydra/launcher=joblib runs the jobs in workers that a signal leaves recorded running"),
    (["hydra.sweeper.params.seed='0,1'"], "hydra.sweeper.params.seed='0,1': hydra.sweeper.params is where a preset "
                                          "(an experiment config) lists its sweep; on the command line sweep the key"),
    # attention=none is a backend's name, not null: the group the command line read as a value is blamed
    (["trainer=true", "attention=none"], "trainer=true: a config group takes one of its choices, not the value true"),
    (["attention=none", "task=NULL"], "task=NULL: a config group takes one of its choices, not null"),
    (["task=[listops,text]"], "task=[listops,text]: a config group takes one choice, not a list; to train each of them, "
                              "sweep them: -m task=listops,text"),
    (["--config-dir", "no/such/folder"], "/no/such/folder' not found; pass an existing folder to --config-dir, or "
                                         "leave it out"),
    # Several values without -m: Hydra's line was cut to "1. To use it as a list, use key=[value1,value2]".
    (["attention=softmax,none"], "attention=softmax,none gives several values, which only a sweep trains: add -m to "
                                 "train each; for one value that is a list write attention=[softmax,none]"),
    (["seed=range(0,3)"], "seed=range(0,3) gives several values, which only a sweep trains: add -m to train each"),
    # -m with --cfg (or --info) was "unexpected ValueError ... a bug in the harness"
    (["-m", "--cfg", "job", "experiment=quickstart"], "-m (--multirun), --cfg, --info, --run and --shell-completion "
                                                      "each choose what the command does: give one of them"),
    (["--info", "-m"], "-m (--multirun), --cfg, --info, --run and --shell-completion each choose"),
    # "Multiple values for experiment. To override a value use 'override experiment: quickstart'"
    (["+experiment=quickstart"], "+experiment=quickstart adds a config group the config has already: choose it with "
                                 "experiment=quickstart (without +)"),
    # a mistyped option was argparse's usage (8 lines) and "lra-train: error: ..."
    (["--cfgg", "job"], "unrecognized arguments: --cfgg job; `lra-train --help` lists its options and --hydra-help Hydra's"),
    (["--cfg", "jb"], "argument --cfg/-c: invalid choice: 'jb' (choose from 'job', 'hydra', 'all'); `lra-train --help`"),
    # a value of the wrong type was OmegaConf's sentence alone, no fix named
    (["trainer.max_steps=abc"], "invalid value for trainer.max_steps: Value 'abc' of type 'str' could not be converted "
                                "to Integer; pass trainer.max_steps=<a whole number>"),
    (["seed=null"], "invalid value for seed: field 'seed' is not Optional; pass seed=<a value: it takes no null or "
                    "empty one>"),
    (["trainer.deterministic=maybe"], "pass trainer.deterministic=<true or false>"),
    # ~key on a key: "Error merging override ~trainer.lr" (no cause), a "harness bug" for ~seed
    (["~trainer.lr"], "~trainer.lr deletes a key every run needs; set it instead (trainer.lr=<value>), or leave it "
                      "out for its default"),
    (["~seed"], "~seed deletes a key every run needs; set it instead (seed=<value>)"),
    (["~resume"], "~resume deletes a key every run needs"),
    (["~trainer.lrr"], "unknown key 'trainer.lrr' (did you mean 'lr'?)"),
    # a deleted group then set: "Error merging override model.dim=2", a bug line for +task.foo=1
    (["~model", "model.dim=2"], "model.dim=2 sets a key of model, which ~model deletes from the config: every run needs "
                                "a model, so leave ~model out (pass model=<lra|profile|reference> to choose another)"),
    (["~task", "+task.foo=1"], "+task.foo=1 sets a key of task, which ~task deletes from the config"),
    (["~trainer"], "trainer=smoke chooses trainer, which ~trainer deletes from the config: every run needs a trainer"),
    # "unknown key 'attention.num_hashes'; valid keys under attention: " (an empty list)
    (["row=yoso_table3/yoso_32", "attention=softmax"], "row=yoso_table3/yoso_32 trains attention=yoso with its own "
                                                       "settings, and attention=softmax contradicts it: pass "
                                                       "row=yoso_table3/softmax for attention=softmax, leave attention= out"),
    # a group's name set apart from its choice: a bug line (logger.name=myrun), or Linformer trained and recorded
    # under attention=none, or ListOps' settings under Text's schema
    (["logger.name=myrun"], "logger.name=myrun differs from logger=none, and a run takes its logger's settings from "
                            "logger=: pass logger=<none|wandb> instead of setting logger.name (W&B names each run by "
                            "its backend's label"),
    (["attention.name=linformer"], "attention.name=linformer differs from attention=softmax, and a run takes its "
                                   "attention's settings from attention=: pass attention=linformer instead"),
    (["task=listops", "task.name=text"], "task.name=text differs from task=listops"),

    (["experiment=quickstart", "attention=softmax", "task=text"], "experiment=quickstart trains task=listops with its "
                                                                  "own settings, and task=text contradicts it"),
])
def test_lra_train_refuses_bad_input_with_one_line_and_no_record(tmp_path, data_dir, args, expected):
    if "cuda" in " ".join(args):
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    result = run_command(["lra-train", "trainer=smoke", *args], tmp_path, data_dir, check=False)
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith("error: ") and expected in line, result.stderr
    assert expected not in result.stdout, "the console gets the line once"
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "a refused config leaves no record and no folder"


def test_a_value_with_letters_beyond_ascii_is_one_line_saying_to_quote_it_and_quoted_it_composes(tmp_path, data_dir):
    """Hydra's lexer refuses a non-ASCII value unquoted (a LexerNoViableAltException): the line says to quote it,
    and the value quoted as it says reaches the config unchanged (a dry run: nothing trained)."""
    refused = run_command(["lra-train", "trainer=smoke", "task.path=/data/café"], tmp_path, data_dir, check=False)
    (line,) = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and line.startswith("error: cannot parse the override 'task.path=/data/café'"), line
    assert "letters beyond ASCII" in line and "must be quoted for Hydra as well as for the shell" in line, line
    shown = run_command(["lra-train", "trainer=smoke", "task.path='/data/café'", "--cfg", "job"], tmp_path, data_dir)
    assert "  path: /data/café\n" in shown.stdout and shown.stderr == ""
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "neither writes anything"


# A dry run (--cfg job|hydra|all, -c) validates as the real run does: the same line, the same status, nothing
# printed on stdout and nothing written.
DRY_RUNS = [
    (["+trainer.max_step=10"], ["--cfg", "job"]),  # printed the invalid config with exit 0
    (["trainer.grad_clip=-1"], ["--cfg", "job"]),
    (["trainer.grad_clip=-1"], ["--cfg", "hydra"]),
    (["attention=nystrom", "attention.num_landmarks=5000"], ["--cfg", "all"]),  # a rule across fields
    (["pretrain.from=no/such/run"], ["-c", "job"]),
    (["trainer.device=cpu", "trainer.precision=bf16"], ["--cfg=job", "--resolve"]),
    (["resume=no/such/run"], ["--cfg", "job"]),  # exit 1 and another line ("cannot resume …: unreadable")
    (["attention=softmax,none"], ["--cfg", "job"]),
    (["experiment=lra_table1"], ["--cfg", "hydra"]),  # printed the sweep's config as if it were one job's
    (["setup=lra_table1/listops", "task=text"], ["--cfg", "job"]),
    (["attention.name=yoso"], ["--cfg", "job"]),  # printed softmax's options under yoso's name
    (["~model", "model.dim=2"], ["--cfg", "job"]),
    (["~data_dir"], ["--cfg", "job"]),  # the dry run's line was "unknown key 'data_dir' (did you mean 'data_dir'?)"  # trained Text with ListOps' model and schedule
]


@pytest.mark.parametrize("overrides,flags", DRY_RUNS, ids=[" ".join(o + f) for o, f in DRY_RUNS])
def test_a_dry_run_refuses_what_the_real_run_refuses_with_the_same_line(tmp_path, data_dir, overrides, flags):
    real = run_command(["lra-train", "trainer=smoke", *overrides], tmp_path / "real", data_dir, check=False)
    dry = run_command(["lra-train", "trainer=smoke", *overrides, *flags], tmp_path / "dry", data_dir, check=False)
    (line,) = real.stderr.strip().splitlines()
    assert real.returncode == 2 and dry.returncode == 2 and dry.stderr.strip() == line, (real.stderr, dry.stderr)
    assert dry.stdout == "", "the refused config is not printed"
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_valid_dry_run_prints_its_config_and_a_resumes_dry_run_checks_the_saved_config(tmp_path, data_dir):
    shown = run_command(["lra-train", "trainer=smoke", "trainer.grad_clip=1", "--cfg", "job"], tmp_path, data_dir)
    assert "grad_clip: 1" in shown.stdout and shown.stderr == ""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "resolved.yaml").write_text("{{{not yaml")
    dry = run_command(["lra-train", f"resume={run}", "--cfg", "job"], tmp_path, data_dir, check=False)
    assert sorted(p.name for p in run.rglob("*")) == [".hydra", "resolved.yaml"], "a dry run writes nothing"
    real = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
    (line,) = dry.stderr.strip().splitlines()
    assert dry.returncode == real.returncode == 1 and real.stderr.strip() == line and dry.stdout == ""
    assert line.startswith(f"error: cannot resume {run}: its .hydra/resolved.yaml is unreadable"), line


# ----------------------------------------------------------------------------- a preset that is a sweep
def preset_sweeps():
    """{preset: the keys it sweeps} for every file in conf/experiment/ whose hydra.sweeper.params sweeps
    (read from the file itself: a new preset is covered when it is added)."""
    presets = {}
    for path in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        params = ((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("sweeper", {}).get("params")
        if params:
            presets[path.stem] = list(params)
    return presets


def test_every_table_and_quickstart_preset_is_a_sweep():
    assert {"lra_table1", "lha_table3", "quickstart", "yoso_table3", "spt", "spt_quickstart"} <= set(preset_sweeps())


@pytest.mark.parametrize("preset,swept", preset_sweeps().items())
def test_a_preset_that_is_a_sweep_refuses_to_run_without_m_and_so_does_its_dry_run(tmp_path, data_dir, preset, swept):
    """Without -m, Hydra ignores a preset's hydra.sweeper.params: `lra-train experiment=lra_table1` trained one
    Softmax job with setup=null and exited 0. One line names -m and the keys that pick one job; exit 2; nothing
    written; the dry run the same."""
    args = [f"experiment={preset}", "trainer=smoke"]
    real = run_command(["lra-train", *args], tmp_path / "real", data_dir, check=False)
    dry = run_command(["lra-train", *args, "--cfg", "job"], tmp_path / "dry", data_dir, check=False)
    (line,) = real.stderr.strip().splitlines()
    assert real.returncode == dry.returncode == 2 and dry.stderr.strip() == line and dry.stdout == "", real.stderr
    assert line.startswith(f"error: experiment={preset} is a sweep ({swept[0]}: "), line
    assert f"which only -m trains: train it with `lra-train -m experiment={preset} trainer=smoke`" in line, line
    assert f"{', '.join(swept)} one value, e.g. `lra-train experiment={preset} trainer=smoke {swept[0]}=" in line, line
    assert not [p for p in tmp_path.rglob("*") if p.is_file()] and not (tmp_path / "real" / "runs").exists()


def test_one_job_of_a_sweep_preset_trains_when_each_swept_key_has_one_value(tmp_path, data_dir):
    """The preset's settings with the one value given for its swept key: exactly one job, what -m would train
    for that value."""
    args = ["experiment=quickstart", "attention=none", "trainer.max_steps=2", "trainer.warmup_steps=0",
            "trainer.eval_every=2", *SMALL_LISTOPS]
    shown = run_command(["lra-train", *args, "--cfg", "job"], tmp_path, data_dir).stdout
    assert "  lr: 0.001\n" in shown and "  name: none\n" in shown, "the preset's learning rate, the attention given"
    run_command(["lra-train", *args], tmp_path, data_dir)
    (run,) = run_dirs(tmp_path)
    record = read_json(run / "metrics.json")
    assert (record["status"], record["label"], record["steps"]) == ("completed", "None", 2)


def test_an_option_between_overrides_is_read_as_hydra_reads_it_in_front(tmp_path, data_dir):
    """`lra-train task=listops -m seed=0` (an option between overrides) was argparse's usage and "unrecognized
    arguments: seed=0": the same command with its options first. A dry run shows the override after --cfg job."""
    shown = run_command(["lra-train", "trainer=smoke", "--cfg", "job", "trainer.grad_clip=2"], tmp_path, data_dir)
    assert "  grad_clip: 2.0\n" in shown.stdout and shown.stderr == ""
    run_command(["lra-train", "attention=none", "-m", "trainer.max_steps=1", "trainer.warmup_steps=0",
                 "hydra.sweep.dir=sweep", *SMALL_LISTOPS], tmp_path, data_dir)
    assert read_json(tmp_path / "sweep" / "0" / "metrics.json")["steps"] == 1 and not (tmp_path / "sweep" / "1").exists()


def paper_cells():
    """Every job of the paper sweeps, as Hydra's runtime.choices names it."""
    for experiment in ("lra_table1", "lha_table3", "yoso_table3"):
        params = OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml").hydra.sweeper.params
        setups = str(params.get("setup", "")).split(",") if "setup" in params else [None]
        for setup, row in itertools.product(setups, str(params.row).split(",")):
            tasks = [setup.split("/")[-1]] if setup else str(params.task).split(",")
            yield from ({"experiment": experiment, "setup": setup, "row": row, "task": task} for task in tasks)


def test_every_paper_cell_is_a_consistent_choice_of_presets():
    cells = list(paper_cells())
    assert len(cells) == 11 * 5 + 11 * 4 + 12 * 5
    for choices in cells:
        check_preset_choices(choices)


@pytest.mark.parametrize("choices,expected", [
    # a setup's task replaced: LRA's ListOps model and schedule trained Text
    ({"setup": "lra_table1/listops", "task": "text"}, "setup=lra_table1/listops is its paper's listops setup, but "
                                                      "task=text: pass setup=lra_table1/text for text"),
    # a row's per-task part chosen as the row: BigBird's text settings without BigBird (softmax trained)
    ({"setup": "lra_table1/text", "row": "lra_table1/bigbird/text", "task": "text"},
     "row=lra_table1/bigbird/text is a part of row lra_table1/bigbird (its text settings, merged by a setup): pass "
     "row=lra_table1/bigbird with setup=lra_table1/text"),
    # an LRA row in the YOSO table: its per-task options (block sizes, attention dropout) silently dropped
    ({"experiment": "yoso_table3", "row": "lra_table1/transformer", "task": "text"},
     "row=lra_table1/transformer keeps its per-task settings in row/lra_table1/transformer/, which only a setup "
     "merges, and this run has none: pass setup=<lha_table3/text|lra_table1/text>"),
    ({"row": "lha_table3/lha", "task": "pathfinder"}, "pass setup=<lra_table1/pathfinder>"),
])
def test_presets_that_cannot_merge_as_chosen_are_refused_naming_the_choice_that_does(choices, expected):
    with pytest.raises(ConfigError) as refused:
        check_preset_choices(choices)
    assert expected in str(refused.value)


def test_a_backend_beside_a_row_is_refused_unless_it_is_the_rows_own():
    """YOSO-32's settings compose on YOSO-C too, which then trained under the row's name; the row's own backend
    again, or a row alone, is no contradiction."""
    with pytest.raises(ConfigError, match=r"row=yoso_table3/yoso_32 trains attention=yoso .* attention=yoso_c "
                                          r"contradicts it"):
        check_presets_against_choices(["-m", "row=yoso_table3/yoso_c_16,yoso_table3/yoso_32", "attention=yoso_c"])
    check_presets_against_choices(["row=yoso_table3/yoso_32", "attention=yoso"])
    check_presets_against_choices(["row=lra_table1/bigbird", "setup=lra_table1/text"])


def test_a_preset_may_train_a_variant_of_another_backend_only_the_command_line_name_is_judged():
    """A preset file of yours (attention=my_yoso16) naming the backend it sets up is a variant, not a contradiction;
    attention.name=yoso typed beside attention=my_yoso16 is refused as on any other choice."""
    cfg = compose_config("attention=yoso", "attention.num_hashes=16")
    check_group_names(cfg, {"attention": "my_yoso16", "task": "listops", "logger": "none"}, ["attention=my_yoso16"])
    with pytest.raises(ConfigError, match=r"^attention.name=yoso differs from attention=my_yoso16, and a run takes"):
        check_group_names(cfg, {"attention": "my_yoso16"}, ["attention=my_yoso16", "attention.name=yoso"])
