"""The console scripts as a user meets them: --help, lra-prepare ahead of lra-train."""

import pytest

from conftest import read_json, run_command, run_dirs
from lra.data import listops


@pytest.mark.parametrize("command", ["lra-train", "lra-prepare", "lra-table", "lra-profile", "lra-fidelity", "lra-sync",
                                     "lra-build-kernels"])
def test_every_command_has_help(tmp_path, command):
    result = run_command([command, "--help"], tmp_path, tmp_path)
    assert result.returncode == 0 and f"usage: {command}" in result.stdout.lower()
    assert "``" not in result.stdout  # docstring markup leaking into the description
    if command == "lra-train":
        assert "attention: bigbird, learned_hash, linear_transformer, linformer" in result.stdout  # the config groups and their choices
        assert "schema" not in result.stdout.split("== Config ==")[0], "internal schemas are not choices"


def test_prepared_release_cache_is_reused_by_training(tmp_path):
    release = tmp_path / "lra_release" / "lra_release" / "listops-1000"
    listops.write_tsv_files(listops.GeneratorSettings(seed=4, num_train=40, num_val=8, num_test=8,
                                                      min_length=20, max_length=200), release)
    data = tmp_path / "data"
    prepared = run_command(["lra-prepare", "listops", "--source", "lra_release", "--path", str(tmp_path / "lra_release"),
                            "--data-dir", str(data)], tmp_path, data)
    assert '"counts": {"test": 8, "train": 40, "val": 8}' in prepared.stdout
    trained = run_command(["lra-train", "trainer=smoke", "trainer.max_steps=2", "task.source=lra_release",
                           f"task.path={release}", "task.max_length=256"], tmp_path, data)
    assert "tokenising" not in trained.stderr, "training must reuse the prepared cache"
    (run,) = run_dirs(tmp_path)
    assert read_json(run / "metrics.json")["status"] == "completed"


def test_lra_prepare_explains_a_bad_override(tmp_path):
    result = run_command(["lra-prepare", "listops", "task.generator.sed=1"], tmp_path, tmp_path, check=False)
    assert result.returncode == 2  # a configuration mistake, as lra-train's
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: unknown key 'task.generator.sed' (did you mean 'seed'?); valid keys under task.generator: ")
    both = run_command(["lra-prepare", "listops", "--source", "generate", "task.source=lra_release"], tmp_path, tmp_path,
                       check=False)  # two spellings of one setting, disagreeing
    assert both.returncode == 2 and both.stderr.strip().splitlines()[-1].endswith(
        "error: --source generate contradicts task.source=lra_release; give one of them")


@pytest.mark.parametrize("args, said", [
    ([], "the task is required: lra-prepare {listops,text,retrieval,image,pathfinder}"),  # "task, overrides" required
    (["retrieval", "task=image"], "task=image contradicts the task retrieval; give one of them"),  # prepared image
    (["listops", "model.dim=3"], "model.dim=3: lra-prepare takes the task's settings (task.*) and data_dir"),  # ignored
    (["listops", "--data-dir", ""], "--data-dir is empty (an unset shell variable?)"),  # the cache went into the cwd
    (["text", "--path", " "], "--path is empty (an unset shell variable?)"),
])
def test_lra_prepare_refuses_what_would_prepare_something_else_before_anything_is_written(tmp_path, monkeypatch,
                                                                                          capsys, args, said):
    from lra.commands.prepare import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2 and said in capsys.readouterr().err.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


def test_wandb_offline_run_lives_in_the_run_directory_and_a_wandb_failure_is_only_a_warning(tmp_path, data_dir):
    from conftest import SMALL_LISTOPS

    args = ["lra-train", "trainer=smoke", "trainer.max_steps=2", "logger=wandb", *SMALL_LISTOPS]
    run_command(args, tmp_path / "offline", data_dir, env_extra={"WANDB_MODE": "offline"})
    (run,) = run_dirs(tmp_path / "offline")
    assert list(run.glob("wandb/offline-run-*/run-*.wandb"))
    # online without credentials: wandb.init fails, which is one warning line in the run's log, and it trains on
    (tmp_path / "home").mkdir()
    unlogged = {"WANDB_MODE": "online", "WANDB_API_KEY": "", "HOME": str(tmp_path / "home")}
    broken = run_command(args, tmp_path / "broken", data_dir, env_extra=unlogged)
    (run,) = run_dirs(tmp_path / "broken")
    said = [line for line in (run / "train.log").read_text().splitlines() if "W&B" in line]
    assert len(said) == 1 and said[0].endswith("warning: W&B logging is off for this run: wandb.init failed (UsageError: "
                                               "No API key configured. Use `wandb login` to log in.); the run trains "
                                               "and records to its folder as without W&B"), said
    assert said[0].split(" - ", 1)[1] in broken.stdout and "Traceback" not in broken.stderr
    assert read_json(run / "metrics.json")["status"] == "completed"
    refused = run_command(args, tmp_path / "refused", data_dir, env_extra={"WANDB_MODE": "not-a-mode"}, check=False)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: WANDB_MODE=not-a-mode is not a W&B mode: set it to one of online, offline, disabled, or unset it "
        "(online when logged in to W&B, else offline)")
    assert not (tmp_path / "refused" / "runs").exists()


def test_lra_gpu_check_quick_on_cpu_runs_every_step_and_writes_its_flat_folder(tmp_path, data_dir):
    """The GPU check's pipeline, small and on CPU, so that it cannot rot before a GPU runs it."""
    result = run_command(["lra-gpu-check", "--device", "cpu", "--quick", "--out", "check"], tmp_path, data_dir)
    out = tmp_path / "check"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["build.log", "kernels.md", "profile.csv", "profile.png", "pytest.log", "summary.md", "sweep.md"], files
    summary = (out / "summary.md").read_text()
    for step in ("kernel build", "CUDA tests", "kernel benchmark", "profile", "sweep"):
        assert f"| {step} | passed |" in summary, summary
    assert "YOSO-16" in (out / "kernels.md").read_text()
    sweep = (out / "sweep.md").read_text()  # a packed sweep (on a GPU captured too)
    assert "Softmax" in sweep and "YOSO-32" in sweep and "tokens/s" in sweep and "runs: 2 completed" in sweep, sweep
    assert "skipped" in (out / "pytest.log").read_text() or "deselected" in (out / "pytest.log").read_text()
    assert "wrote" in result.stdout


def test_lra_prepare_takes_any_folder_name_and_lra_trains_printed_command_runs_as_printed(tmp_path):
    """--path and --data-dir are folder names, not Hydra overrides: parentheses, a comma, a quote and ${...}
    (a folder copied as 'lra_release (1)') are taken as they are, and the lra-prepare command lra-train prints
    for a missing cache runs as printed."""
    import shlex

    from helpers import write_aan

    raw, data = tmp_path / "lra_release (1), x", tmp_path / "data (copy)"
    write_aan(raw)
    missing = run_command(["lra-train", "task=retrieval", "task.source=lra_release", f"task.path='{raw}'",
                           "trainer=smoke", "trainer.max_steps=2", "hydra.run.dir=run"], tmp_path, data, check=False)
    line = missing.stderr.strip().splitlines()[-1]
    assert missing.returncode == 1 and "prepare it once with: lra-prepare retrieval" in line, missing.stderr
    prepared = run_command(shlex.split(line.split("prepare it once with: ", 1)[1]), tmp_path, data, check=False)
    assert prepared.returncode == 0 and '"counts": {"test": 6, "train": 6, "val": 6}' in prepared.stdout, prepared.stderr
    odd = tmp_path / "it's ${HOME}"
    write_aan(odd)
    again = run_command(["lra-prepare", "retrieval", "--path", str(odd), "--data-dir", str(tmp_path / "d,2")], tmp_path,
                        data, check=False)
    assert again.returncode == 0, again.stderr
    (cache,) = (tmp_path / "d,2" / "retrieval" / "cache").iterdir()
    assert read_json(cache / "manifest.json")["raw_folder"] == str(odd / "lra_release" / "tsv_data")
