"""Bad input and faults: every mistake is one line and a non-zero exit, no default is substituted for
an invalid value, nothing claims a success that did not happen, and no completed result changes."""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from lra.errors import ConfigError
from lra.validation import validate
from test_config import compose_config

# One case per kind of rule: (overrides, the field the error names, words of the rule).
BAD_CONFIGS = [
    (["trainer.grad_clip=-1"], "trainer.grad_clip", "(0, ∞)"),  # would flip the gradient
    (["trainer.lr=nan"], "trainer.lr", "finite"),
    (["trainer.beta1=1.5"], "trainer.beta1", "[0, 1)"),
    (["trainer.eps=0"], "trainer.eps", "(0, ∞)"),
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
    (["task.num_classes=1"], "task.num_classes", "≥ 2"),
    (["task=text", "task.source=aclimdbb"], "task.source", "one of tfds, aclimdb"),
    (["task.vocab_size=5"], "task.vocab_size", "≥ 17"),
    (["task.generator.max_length=5"], "task.generator.max_length", "≥ 502"),  # looped forever
    (["task.generator.num_train=0"], "task.generator.num_train", "≥ 1"),
    (["task.generator.num_test=0"], "task.generator.num_test", "≥ 1"),
    (["task=pathfinder", "task.max_length=100"], "task.max_length", "resolution² = 1024"),
    (["task=pathfinder", "task.generator.num_images=3"], "task.generator.num_images", "≥ 10"),
    (["task=text", "task.document_bytes=0"], "task.document_bytes", "≥ 1 (or null)"),
    (["attention=yoso", "attention.hash_code_len=0"], "attention.hash_code_len", "between 1 and 20"),  # was the default τ
    (["attention=yoso", "attention.hash_code_len=40"], "attention.hash_code_len", "between 1 and 20"),
    (["attention=yoso", "attention.num_hashes=0"], "attention.num_hashes", "≥ 1"),
    (["attention=yoso", "attention.backward=exat"], "attention.backward", "one of lower_bound"),
    (["attention=yoso_c", "attention.conv_window=4"], "attention.conv_window", "odd"),
    (["attention=reformer", "attention.num_hashes=0"], "attention.num_hashes", "≥ 1"),
    (["attention=reformer", "attention.num_buckets=3"], "attention.num_buckets", "even"),
    (["attention=performer", "attention.feature_epsilon=-1"], "attention.feature_epsilon", "[0, ∞)"),
    (["attention=softmax", "attention.dropout=1.0"], "attention.dropout", "[0, 1)"),
    (["attention=learned_hash", "attention.local_window=1"], "attention.local_window", "≥ 2"),
    (["logger=wandb", "logger.project=''"], "logger.project", "W&B project name"),
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
]


@pytest.mark.parametrize("overrides,field,rule", BAD_CONFIGS, ids=[" ".join(c[0]) for c in BAD_CONFIGS])
def test_every_invalid_value_is_one_line_naming_field_value_and_rule(overrides, field, rule):
    cfg = compose_config(*overrides)
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    message = str(error.value)
    assert message.startswith(f"invalid value for {field}: ") and rule in message and "\n" not in message
    assert f"pass {field}=" in message


def test_every_preset_and_default_is_valid():
    for overrides in ([], ["task=pathfinder"], ["task=text"], ["task=retrieval"], ["task=image"],
                      ["trainer=smoke"], ["logger=wandb"], ["experiment=quickstart"]):
        validate(compose_config(*overrides))


@pytest.mark.parametrize("args,expected", [
    (["trainer.grad_clip=-1"], "invalid value for trainer.grad_clip: -1.0"),
    (["+trainer.max_step=10"], "unknown key 'trainer.max_step' (did you mean 'max_steps'?); valid keys under trainer: "),
    (["seeed=1"], "unknown key 'seeed' (did you mean 'seed'?); valid keys at the top level: attention, data_dir"),
    (["attention=yoso", "attention.impl=cuda"], "attention.impl=cuda but this machine has no CUDA device"),
    (["trainer.device=cuda"], "trainer.device=cuda but this machine has no CUDA device"),  # left a failed run folder
    (["trainer.device=cpu", "trainer.precision=fp16"], "invalid value for trainer.precision: 'fp16'"),  # the same
    (["~model"], "the config has no model (was it deleted with ~model?)"),  # was a traceback
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


RESUMABLE = ["trainer=smoke", "trainer.max_steps=12", "trainer.eval_every=4", "trainer.checkpoint_every=4",
             "attention=softmax", *SMALL_LISTOPS]


def test_a_run_directory_belongs_to_one_process(tmp_path, data_dir):
    """A trainer stopped mid-run (SIGSTOP at its second checkpoint) still owns its folder: a resume
    of it stops with a line naming the holder and changes nothing; once the holder is gone, the
    resume goes ahead and completes."""
    env = {**os.environ, "LRA_DATA_DIR": str(data_dir), "WANDB_MODE": "disabled", "LRA_FAULT": "after_checkpoint:2:SIGSTOP"}
    exe = os.path.join(os.path.dirname(sys.executable), "lra-train")
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen([exe, *RESUMABLE], cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        _, status = os.waitpid(first.pid, os.WUNTRACED)  # returns when the trainer stops itself
        assert os.WIFSTOPPED(status), (tmp_path / "first.log").read_text()
        (run,) = run_dirs(tmp_path)
        before = (run / "metrics.json").read_bytes()
        second = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
        last = second.stderr.strip().splitlines()[-1]
        assert second.returncode == 1 and f"the run directory {run} is in use by process {first.pid}" in last, second.stderr
        assert (run / "metrics.json").read_bytes() == before
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    resumed = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert "resumed from" in resumed.stderr + resumed.stdout
    assert read_json(run / "metrics.json")["status"] == "completed"


def test_a_failed_resume_leaves_the_record_and_a_completed_run_is_not_resumed(tmp_path, data_dir):
    killed = run_command(["lra-train", *RESUMABLE], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "after_checkpoint:2"}, check=False)
    assert killed.returncode != 0
    (run,) = run_dirs(tmp_path)
    last = run / "checkpoints" / "last.pt"
    good = last.read_bytes()
    last.write_bytes(good[: len(good) // 3])  # a damaged checkpoint
    before = (run / "metrics.json").read_bytes()
    failed = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode == 1 and "cannot resume from" in lines[-1] and "left as it was" in lines[-1]
    assert (run / "metrics.json").read_bytes() == before, "a failed resume must not rewrite the record"
    last.write_bytes(good)
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    completed = (run / "metrics.json").read_bytes()
    assert read_json(run / "metrics.json")["status"] == "completed"
    again = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert "already completed" in again.stderr + again.stdout
    longer = run_command(["lra-train", f"resume={run}", "trainer.max_steps=24"], tmp_path, data_dir, check=False)
    last = longer.stderr.strip().splitlines()[-1]
    assert longer.returncode == 2 and last.startswith(f"error: {run} completed at step ") and last.endswith(
        f"train a new run instead: lra-train {' '.join(o for o in RESUMABLE if 'max_steps' not in o)} "
        "trainer.max_steps=24"), longer.stderr
    assert (run / "metrics.json").read_bytes() == completed, "a completed result never changes"


@pytest.mark.parametrize("content", ["", "{{{not yaml", "- a list\n"])
def test_resume_with_a_damaged_saved_config_is_one_line(tmp_path, data_dir, content):
    run = tmp_path / "runs" / "x"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "resolved.yaml").write_text(content)
    result = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "cannot resume" in last and "resolved.yaml is unreadable" in last, result.stderr
    assert not (run / "metrics.json").exists()


# ------------------------------------------------------------------------------------ lra-table
def write_record(folder, content):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(content if isinstance(content, str) else json.dumps(content))


def test_lra_table_counts_each_run_once_and_reads_any_file(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    write_record(sweep / "0", {"label": "Softmax", "task": "listops", "seed": 0, "status": "completed", "test_accuracy": 30.0})
    write_record(sweep / "1", {"label": "Softmax", "task": "listops", "seed": 1, "status": "completed", "test_accuracy": 34.0})
    write_record(sweep / "2", {"label": "Softmax", "task": "listops", "seed": 1, "status": "failed", "test_accuracy": None})
    write_record(sweep / "3", "{ not json")
    write_record(sweep / "4", "")
    write_record(sweep / "5", "[1, 2]")
    write_record(sweep / "6", {"task": "listops"})
    result = run_command(["lra-table", str(sweep), str(sweep / "0"), str(sweep / "0" / "metrics.json"), "--format", "csv"],
                         tmp_path, data_dir)
    assert "Traceback" not in result.stderr
    row = [line for line in result.stdout.splitlines() if line.startswith("Softmax,listops")][0]
    assert ",32.0," in row and ",2,0" in row, row  # mean 32 over 2 seeds, the failed duplicate dropped
    notes = result.stderr
    assert "dropped" in notes and "seed 1" in notes
    for bad in ("3", "4", "5", "6"):
        assert f"skipped {sweep / bad / 'metrics.json'}" in notes


@pytest.mark.parametrize("args,code,expected", [
    (["--metric", "test_acc"], 2, "no run record has the metric 'test_acc'; choose --metric from "),
    (["--reference", "nowhere.csv"], 2, "cannot read the reference table 'nowhere.csv'"),
    (["--metric", "label"], 2, "--metric label is not a number in the run records; choose --metric from "),  # a traceback
    (["--reference", "words.csv"], 2, "its listops value for Softmax is 'high', not a number"),  # a traceback
    (["--efficiency", "text"], 2, "no runs of task 'text' for --efficiency; choose one of listops"),  # empty columns
    (["--plot-task", "text", "--plot", "p.png"], 2, "no runs of task 'text' to plot"),
])
def test_lra_table_mistakes_are_one_line(tmp_path, data_dir, args, code, expected):
    write_record(tmp_path / "r", {"label": "Softmax", "task": "listops", "seed": 0, "status": "completed", "test_accuracy": 30.0})
    (tmp_path / "words.csv").write_text("method,listops,avg\nSoftmax,high,1\n")
    result = run_command(["lra-table", str(tmp_path / "r"), *args], tmp_path, data_dir, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == code and last.startswith("error: ") and expected in last, result.stderr


def test_lra_table_wandb_without_a_key_is_one_line(tmp_path, data_dir):
    env = {"WANDB_API_KEY": "", "HOME": str(tmp_path), "WANDB_CONFIG_DIR": str(tmp_path / "wandb")}
    result = run_command(["lra-table", "--wandb", "someone/project"], tmp_path, data_dir, env_extra=env, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "cannot read the W&B project 'someone/project'" in last and "wandb login" in last


# ---------------------------------------------------------------------------------- lra-prepare
# (text: tests/test_data_sources.py runs its printed commands, asserting them word for word)
@pytest.mark.parametrize("task", ["retrieval", "pathfinder"])
def test_the_printed_rebuild_command_runs_as_printed(tmp_path, task):
    """A damaged cache is refused with the command that rebuilds it: run exactly that command, then
    training works (the printed command has overrides after --data-dir and --force last)."""
    import shlex

    from test_data_sources import write_aan, write_aclimdb, write_pathfinder

    raw, data = tmp_path / "raw", tmp_path / "data"
    source = {"text": lambda: ["task.source=aclimdb", f"task.path={write_aclimdb(raw)}"],
              "retrieval": lambda: [f"task.path={write_aan(raw).parent.parent}"],
              "pathfinder": lambda: ["task.source=lra_release", f"task.path={write_pathfinder(raw, count=30).parent.parent}"]}[task]()
    args = ["lra-train", f"task={task}", "trainer=smoke", "trainer.max_steps=2", "trainer.max_length=64",
            "model.num_layers=1", *source]
    missing = run_command(args, tmp_path, data, check=False)
    prepare = missing.stderr.strip().splitlines()[-1].split("prepare it once with: ")[1]
    run_command(shlex.split(prepare), tmp_path, data)
    (tokens,) = data.rglob("train.tokens0.npy")
    tokens.write_bytes(tokens.read_bytes()[:-3])
    damaged = run_command(args, tmp_path, data, check=False)
    last = damaged.stderr.strip().splitlines()[-1]
    assert damaged.returncode == 1 and "is damaged" in last, damaged.stderr
    rebuild = last.split("rebuild it with: ")[1]
    assert rebuild.endswith("--force") and "--data-dir" in rebuild
    run_command(shlex.split(rebuild), tmp_path, data)
    run_command(args, tmp_path, data)


def test_lra_prepare_rebuilds_a_cache_whose_manifest_is_damaged(tmp_path, data_dir):
    small = [o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]
    first = run_command(["lra-prepare", "listops", "--data-dir", str(tmp_path / "d"), *small], tmp_path, data_dir)
    (manifest,) = (tmp_path / "d").rglob("manifest.json")
    manifest.write_text(manifest.read_text()[:50])
    again = run_command(["lra-prepare", "listops", *small, "--data-dir", str(tmp_path / "d")], tmp_path, data_dir)
    assert "is damaged (unreadable manifest.json); rebuilding it" in again.stderr + again.stdout
    assert json.loads(again.stdout.strip().splitlines()[-1])["fingerprint"] == json.loads(first.stdout.strip().splitlines()[-1])["fingerprint"]


# ------------------------------------------------------------------------ lra-profile, lra-fidelity
TOOL_MISTAKES = [
    ("lra-profile", ["preset=smoke", "backends=[softmax,sofmax]"], "invalid value for backends: ['softmax', 'sofmax']"),
    ("lra-profile", ["preset=smoke", "lengths=[-8]"], "invalid value for lengths: [-8]"),
    ("lra-profile", ["preset=smoke", "mode=biggest"], "invalid value for mode: 'biggest'; it must be one of fixed, largest"),
    ("lra-fidelity", ["preset=smoke", "options.yoso.num_hashes=0"], "invalid value for options.yoso.num_hashes: 0"),
    ("lra-fidelity", ["preset=smoke", "seeds=[]"], "invalid value for seeds: []"),
    ("lra-fidelity", ["preset=smoke", "score_std=0"], "invalid value for score_std: 0"),
]
CUDA_ASKED = [("lra-profile", ["device=cuda"], "device=cuda"), ("lra-fidelity", ["yoso_impl=cuda"], "yoso_impl=cuda"),
              ("lra-fidelity", ["device=cuda"], "device=cuda")]


def compose_tool_config(command, overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from lra.config import FIDELITY_CONF_DIR, PROFILE_CONF_DIR

    root, name = {"lra-profile": (PROFILE_CONF_DIR, "lra_profile"), "lra-fidelity": (FIDELITY_CONF_DIR, "lra_fidelity")}[command]
    with initialize_config_dir(config_dir=str(root), version_base="1.3"):
        cfg = compose(config_name=name, overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):  # the tools' paths interpolate Hydra's run folder (never created here)
        cfg.hydra.runtime.output_dir = "out"
        HydraConfig.instance().set_config(cfg)
        del cfg.hydra
    return cfg


@pytest.mark.parametrize("command,args,expected", TOOL_MISTAKES, ids=[" ".join(c[1]) for c in TOOL_MISTAKES])
def test_tool_config_mistakes_are_one_line(command, args, expected):
    from lra.validation import validate_tool

    with pytest.raises(ConfigError) as error:
        validate_tool(compose_tool_config(command, args))
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)


@pytest.mark.parametrize("command,args,setting", CUDA_ASKED, ids=[f"{c[0]} {c[2]}" for c in CUDA_ASKED])
def test_asking_for_cuda_without_a_gpu_is_one_line(command, args, setting):
    import torch

    from lra.validation import validate_tool

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError) as error:
        validate_tool(compose_tool_config(command, ["preset=smoke", *args]))
    assert f"{setting} but this machine has no CUDA device" in str(error.value)


@pytest.mark.parametrize("command,args,expected", [TOOL_MISTAKES[1], TOOL_MISTAKES[3], CUDA_ASKED[1][:2] + ("no CUDA device",)])
def test_the_tools_end_a_config_mistake_with_one_line_and_exit_2(tmp_path, data_dir, command, args, expected):
    """The checks above, end to end through the console commands (the last one only without CUDA)."""
    if "cuda" in " ".join(args):
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
        args = ["preset=smoke", *args]
    result = run_command([command, *args, f"hydra.run.dir={tmp_path / 'out'}"], tmp_path, data_dir, check=False)
    (line,) = result.stderr.strip().splitlines()  # Hydra's "Error executing job" line was a second one
    assert result.returncode == 2 and line.startswith("error: ") and expected in line, result.stderr
    assert not (tmp_path / "out").exists(), "a refused config leaves no folder"


def test_a_profile_whose_every_cell_fails_exits_non_zero(tmp_path, data_dir):
    """Cells that all fail (the measuring process killed) still write their report; the command says
    so and exits 1."""
    result = run_command(["lra-profile", "preset=smoke", "backends=[softmax]", f"hydra.run.dir={tmp_path / 'out'}"],
                         tmp_path, data_dir, env_extra={"LRA_FAULT": "profile_cell:1"}, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "every cell failed" in last, result.stderr
    assert (tmp_path / "out" / "profile.md").is_file()


# ---------------------------------------------------------------- kills during long operations
def test_a_killed_listops_generation_is_cleaned_up_and_resumed(tmp_path, data_dir):
    data = tmp_path / "data"
    args = ["lra-prepare", "listops", "--data-dir", str(data), *[o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]]
    killed = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "listops_example:60"}, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert list(data.rglob(".basic_*.partial")), "the kill left its temporaries"
    assert not list(data.rglob("basic_*.tsv")), "no official file name for a partial generation"
    run_command(args, tmp_path, data_dir)
    assert not list(data.rglob(".basic_*.partial")) and len(list(data.rglob("basic_*.tsv"))) == 3


def test_a_killed_conversion_is_cleaned_up_and_the_cache_is_readable_by_the_group(tmp_path, data_dir):
    data = tmp_path / "data"
    args = ["lra-prepare", "listops", "--data-dir", str(data), *[o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]]
    killed = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "cache_example:40"}, check=False)
    assert killed.returncode == -signal.SIGKILL
    cache_root = data / "listops" / "cache"
    assert [p for p in cache_root.iterdir() if p.name.startswith(".")], "the kill left its staging folder"
    run_command(args, tmp_path, data_dir)
    (cache,) = [p for p in cache_root.iterdir()]  # the staging folder is gone, the cache is in place
    assert (cache / "manifest.json").is_file()
    assert cache.stat().st_mode & 0o050 == 0o050, oct(cache.stat().st_mode)  # group may list and read


def test_a_listops_length_window_with_no_expression_stops_the_generator_with_the_fix(monkeypatch):
    """max_length=5 passes the settings' rules but no depth-1 tree fits 3 < length < 5: the generator
    gives up after STALL_LIMIT draws without a new expression instead of looping forever."""
    import lra.data.listops as listops
    from lra.errors import UserError

    monkeypatch.setattr(listops, "STALL_LIMIT", 2000)
    settings = listops.GeneratorSettings(min_length=3, max_length=5, max_depth=1, num_train=10, num_val=1, num_test=1)
    with pytest.raises(UserError, match="found only 0 distinct expressions .* widen task.generator.min_length/max_length"):
        list(listops.generate(settings))
