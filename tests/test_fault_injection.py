"""Faults a run meets between a kill and its resume: a checkpoint that is no file, a run killed while it saved
its config, a write stopped by a file-size limit, a resume by another torch build or on another device, a
best checkpoint damaged since. Each ends in one line naming the fix with nothing lost, or in a resume whose
files are the run's own (faults through lra/faults.py's hooks; no sleeps)."""

from __future__ import annotations

import errno
import os
import resource
import shlex
import shutil

import pytest
import torch

from conftest import SMALL_LISTOPS, read_json, run_command

# One layer, best validation at step 3 of 6 (seed 3): the second evaluation does not rewrite best.pt.
RUN = ["trainer=smoke", "trainer.max_steps=6", "trainer.eval_every=3", "trainer.checkpoint_every=3",
       "attention=softmax", "seed=3", "model.num_layers=1", *SMALL_LISTOPS]


def snapshot(folder):
    """Every file under ``folder`` (the lock file and the log aside) with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in (".lock", "train.log")}


def one_error_line(result, code=1):
    errors = [line for line in result.stderr.strip().splitlines() if line.startswith("error:")]
    assert result.returncode == code and len(errors) == 1, (result.returncode, result.stderr)
    assert result.stderr.strip().splitlines()[-1] == errors[0] and "Traceback" not in result.stderr, result.stderr
    return errors[0]


@pytest.fixture(scope="module")
def killed(tmp_path_factory, data_dir):
    """A run SIGKILLed right after its step-3 last.pt (its best.pt is step 3's): each test damages a copy."""
    root = tmp_path_factory.mktemp("killed")
    result = run_command(["lra-train", *RUN, "hydra.run.dir=run"], root, data_dir,
                         env_extra={"LRA_FAULT": "after_checkpoint:2"}, check=False)
    assert result.returncode != 0 and read_json(root / "run" / "metrics.json")["steps"] == 3, result.stderr
    return root / "run"


@pytest.fixture
def run(killed, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(killed, copy)
    return copy


@pytest.mark.parametrize("what", ["a folder", "a named pipe"])
def test_a_checkpoint_that_is_no_file_is_refused_not_taken_for_none(run, tmp_path, data_dir, what):
    """It was taken for no checkpoint: the run trained again from step 0 over its best.pt and history (a
    folder then failed at the step-3 save; a pipe was replaced by a new last.pt)."""
    last = run / "checkpoints" / "last.pt"
    last.unlink()
    last.mkdir() if what == "a folder" else os.mkfifo(last)
    before = snapshot(run)
    line = one_error_line(run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False))
    assert line.startswith(f"error: cannot resume from {last}: it is {what}, not a checkpoint file; move it away"), line
    assert snapshot(run) == before and (last.is_dir() if what == "a folder" else not last.is_file())


def test_a_run_killed_while_saving_its_config_names_the_command_that_starts_it_again(tmp_path, data_dir):
    """It was "not an lra-train run directory … pass a run folder such as runs/<date>/<time>": no way on."""
    run = tmp_path / "runs" / "cut"
    killed = run_command(["lra-train", *RUN, f"hydra.run.dir={run}"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "write:4"}, check=False)  # .hydra/resolved.yaml, not yet renamed
    assert killed.returncode != 0 and not (run / ".hydra" / "resolved.yaml").exists()
    line = one_error_line(run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False), code=2)
    start = f"error: resume={run} holds a run stopped while it saved its config (no .hydra/resolved.yaml): nothing was " \
            "trained there, so there is nothing to resume; start it again with "
    assert line.startswith(start), line
    again = shlex.split(line[len(start):])
    assert again == ["lra-train", *RUN, f"hydra.run.dir={run}"], again
    run_command(again, tmp_path, data_dir)
    assert read_json(run / "metrics.json")["status"] == "completed" and not list(run.rglob("*.tmp"))


def test_a_write_over_the_file_size_limit_is_one_line_and_the_run_resumes(tmp_path, data_dir):
    """EFBIG (``ulimit -f``; Python ignores SIGXFSZ) was "unexpected OSError … a bug in the harness"."""
    run = tmp_path / "run"
    result = run_command(["lra-train", *RUN, f"hydra.run.dir={run}"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "checkpoint_write:2:EFBIG"}, check=False)  # the step-3 last.pt
    line = one_error_line(result)
    assert line == (f"error: File too large ({run / 'checkpoints' / 'last.pt'}): raise the limit on file sizes "
                    "(ulimit -f) or write to a file system that takes larger files; nothing finished was changed"), line
    assert not list(run.rglob("*.tmp")) and not (run / "checkpoints" / "last.pt").exists()
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert read_json(run / "metrics.json")["status"] == "completed"


def test_a_real_file_size_limit_keeps_the_previous_file_and_names_the_fix(tmp_path):
    """The kernel's EFBIG under RLIMIT_FSIZE, through the atomic writer every record and checkpoint uses."""
    from lra.commands.config_errors import failure
    from lra.io import atomic_write

    target = tmp_path / "last.pt"
    target.write_bytes(b"the previous checkpoint")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError) as raised:
            atomic_write(target, lambda handle: handle.write(b"x" * 10000), mode="wb")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert raised.value.errno == errno.EFBIG and raised.value.filename == str(target)
    assert target.read_bytes() == b"the previous checkpoint" and [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    line, status = failure(raised.value)
    assert status == 1 and line.startswith(f"File too large ({target}): raise the limit on file sizes (ulimit -f)")


@pytest.mark.parametrize("other", [{"torch": "2.0.0+cu118"}, {"device": "cuda", "precision": "bfloat16"}],
                         ids=["another torch", "another device"])
def test_a_resume_by_another_build_or_device_is_refused(run, tmp_path, data_dir, other):
    """A run trained elsewhere (trainer.device=auto, precision=auto) went on under this torch and device, its
    record naming only the last: a mix no single setup computes."""
    last = run / "checkpoints" / "last.pt"
    payload = torch.load(last, weights_only=False)
    assert payload["build"] == {"torch": torch.__version__, "device": "cpu", "precision": "float32", "processes": "1",
                                "cpu_threads": payload["build"]["cpu_threads"]}
    assert payload["build"]["cpu_threads"].isdigit()
    payload["build"].update(other)
    torch.save(payload, last)
    before = snapshot(run)
    line = one_error_line(run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False))
    said = "; ".join(f"{key} {value} (this process: {({'torch': torch.__version__, 'device': 'cpu', 'precision': 'float32'})[key]})"
                     for key, value in other.items())
    assert line.startswith(f"error: cannot resume from {last}: it was trained with {said}, and a run resumes exactly "
                           "only as it was computed; resume it where it ran ("), line
    assert snapshot(run) == before


def test_a_resume_by_another_number_of_processes_is_refused_naming_the_torchrun_command(run, tmp_path, data_dir):
    """A run begun by 2 torchrun processes and resumed by one (the resume line named plain lra-train) went on
    with other dropout draws, its record saying processes 1 alone."""
    from lra.run import resume_command

    last = run / "checkpoints" / "last.pt"
    payload = torch.load(last, weights_only=False)
    payload["build"]["processes"] = "2"
    torch.save(payload, last)
    before = snapshot(run)
    line = one_error_line(run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False))
    assert line == (f"error: cannot resume from {last}: it was computed by 2 process(es) and this is 1, and each "
                    "process draws the dropout of its share of the batch: resume it with torchrun --standalone "
                    f"--nproc_per_node=2 $(which lra-train) resume={run}; the run's metrics.json is left as it was")
    assert snapshot(run) == before
    assert resume_command(run, 2) == f"torchrun --standalone --nproc_per_node=2 $(which lra-train) resume={run}"
    # its record (processes 1) is read first: before the saved batch is judged against 2 processes, which named
    # the saved config as refused
    torchrun = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29998"}
    line = one_error_line(run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, env_extra=torchrun,
                                      check=False))
    assert line == (f"error: cannot resume from {run}: it was computed by 1 process(es) and this is 2, and each process "
                    "draws the dropout of its share of the batch: resume it with lra-train "
                    f"resume={run}; the run's metrics.json is left as it was")
    assert snapshot(run) == before


def test_a_resume_writes_best_pt_from_its_checkpoint(run, tmp_path, data_dir):
    """best.pt damaged (or left by the killed process from a later validation) after the checkpoint: the run
    completed with a record naming the checkpoint's best step beside a best.pt that was not it."""
    best = run / "checkpoints" / "best.pt"
    best.write_bytes(b"not a checkpoint")
    held = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    record = read_json(run / "metrics.json")
    assert (record["status"], record["best_step"]) == ("completed", 3), "validation did not improve after step 3"
    written = torch.load(best, weights_only=False)
    assert written["step"] == 3 and written["model"].keys() == held["best_weights"].keys()
    assert all(torch.equal(written["model"][k], held["best_weights"][k]) for k in written["model"])


def no_kernels(tmp_path) -> dict:
    """An environment where YOSO's kernels cannot be built (no compiler, an empty kernel cache): impl=auto takes
    its PyTorch path."""
    return {"CXX": "no-such-compiler", "LRA_KERNEL_CACHE": str(tmp_path / "empty-cache")}


def test_a_yoso_run_on_its_kernels_resumed_where_they_cannot_be_built_is_refused(tmp_path, data_dir):
    """attention.impl=auto takes YOSO's PyTorch path where the compiled kernels cannot be built (with a warning):
    a run trained on the kernels would have gone on on the PyTorch path, its record naming neither. Between
    the stages of self-pretraining too (stage 2 starts without a checkpoint of its own)."""
    for name, fault, source in (("run", "after_checkpoint:2", "checkpoints/last.pt"),
                                ("spt", "stage_recorded:1", "its stage 1")):
        extra = ["pretrain=masked"] * (name == "spt")
        killed = run_command(["lra-train", *RUN, "attention=yoso", *extra, f"hydra.run.dir={name}"], tmp_path, data_dir,
                             env_extra={"LRA_FAULT": fault}, check=False)
        run = tmp_path / name
        engine = "pretrain_attention_engine" if name == "spt" else "attention_engine"
        assert killed.returncode != 0 and read_json(run / "metrics.json")[engine] == "kernel", killed.stderr
        before = snapshot(run)
        result = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, env_extra=no_kernels(tmp_path),
                             check=False)
        line = one_error_line(result)
        assert "pure-PyTorch implementation" in result.stderr  # impl=auto's warning, before the refusal
        where = run / source if name == "run" else source
        assert line == (f"error: cannot go on from {where}: it computed YOSO on its compiled kernels (attention_engine "
                        "kernel), which this process cannot build (this process: torch), and a run goes on only as it "
                        "was computed; build them here (lra-build-kernels cpu says why they do not), or resume it "
                        "where it ran; the run's metrics.json is left as it was"), line
        assert snapshot(run) == before, name
        resumed = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)  # where the kernels are
        record = read_json(run / "metrics.json")
        assert (record["status"], record["attention_engine"]) == ("completed", "kernel"), resumed.stderr


def test_a_yoso_run_begun_on_its_pytorch_path_goes_on_on_it_where_the_kernels_are(tmp_path, data_dir):
    """The PyTorch path is there wherever the kernels are: the resume takes it, says so, and ends as the run
    never interrupted on it (attention.impl=torch)."""
    killed = run_command(["lra-train", *RUN, "attention=yoso", "hydra.run.dir=run"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "after_checkpoint:2", **no_kernels(tmp_path)}, check=False)
    run = tmp_path / "run"
    assert killed.returncode != 0 and read_json(run / "metrics.json")["attention_engine"] == "torch", killed.stderr
    resumed = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert "YOSO goes on on its PyTorch path, as " in resumed.stdout + resumed.stderr
    run_command(["lra-train", *RUN, "attention=yoso", "attention.impl=torch", "hydra.run.dir=torch"], tmp_path,
                data_dir)
    record, uninterrupted = read_json(run / "metrics.json"), read_json(tmp_path / "torch" / "metrics.json")
    assert (record["status"], record["attention_engine"], record["resumed_at_steps"]) == ("completed", "torch", [3])
    for key in ("best_step", "best_val_accuracy", "test_accuracy", "test_loss", "attention_engine"):
        assert record[key] == uninterrupted[key], key
    assert read_json(run / "history.json") == read_json(tmp_path / "torch" / "history.json")
