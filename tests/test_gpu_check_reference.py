"""lra-gpu-check --reference: a slice of the reference ListOps runs checked before anything runs as lra-train
checks a config (the same lines, exit 2), its sweep folder checked, its records packed with their configs, and a
slice cut at its limit or stopped by a signal recorded as interrupted and continued exactly by the same command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from omegaconf import OmegaConf

from command_server import shell_signal_handling
from conftest import SMALL_LISTOPS, one_run, run_command
from helpers import main_in_process
from lra.commands import gpu_check


SMOKE = ["trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2", *SMALL_LISTOPS]


def environment(data_dir, **extra) -> dict:
    return {**os.environ, "LRA_DATA_DIR": str(data_dir), "WANDB_MODE": "disabled", "PYTHONHASHSEED": "0", **extra}


def test_a_reference_slice_runs_its_rows_and_seeds_and_packs_their_records(tmp_path, data_dir):
    """A device command runs at most 10 minutes, the reference ListOps table takes longer: --rows and
    --seeds choose a slice, run packed in one process (two at a time here), and its records come back in one
    archive that unpacks beside other slices', each with the config its run trained."""
    out = tmp_path / "out"
    run_command(["lra-gpu-check", "--device", "cpu", "--reference", "--rows", "softmax,yoso_32", "--seeds", "0,1",
                 "--limit-s", "300", "--out", str(out), "--runs-per-process", "2", "--sweep-dir", str(tmp_path / "sweep"),
                 "--", *SMOKE], tmp_path, data_dir)
    assert "PackedLauncher" in (tmp_path / "sweep" / "multirun.yaml").read_text()  # two packs of two runs
    reference = (out / "reference.md").read_text()
    assert "runs: 4 completed" in reference
    assert "every run (4):" in reference and "| YOSO-32 | listops | 1 | completed | " in reference  # lra-table --runs
    with tarfile.open(out / "reference-records.tar.gz") as archive:
        archive.extractall(tmp_path / "records", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    names = sorted(path.parent.name for path in (tmp_path / "records").rglob("metrics.json"))
    assert names == ["softmax-seed0", "softmax-seed1", "yoso-32-seed0", "yoso-32-seed1"]
    record = json.loads((tmp_path / "records" / "yoso-32-seed1" / "metrics.json").read_text())
    assert (record["status"], record["seed"], record["task"]) == ("completed", 1, "listops")
    assert record["wall_time_seconds"] > 0 and record["device"].startswith("cpu")
    # each record beside the resolved config its run trained (the run folder's .hydra/resolved.yaml) and its overrides
    assert sorted(path.name for path in (tmp_path / "records" / "yoso-32-seed1").iterdir()) == [
        "metrics.json", "overrides.yaml", "resolved.yaml"]
    packed = OmegaConf.load(tmp_path / "records" / "yoso-32-seed1" / "resolved.yaml")
    run = Path(record["run_dir"])
    assert (tmp_path / "records" / "yoso-32-seed1" / "resolved.yaml").read_text() == (run / ".hydra" / "resolved.yaml").read_text()
    assert (packed.seed, packed.task.name, packed.attention.name, packed.attention.num_hashes) == (1, "listops", "yoso", 32)
    assert (packed.trainer.max_steps, packed.model.pooling, packed.model.padding_mask) == (2, "mean_zeroed_padding", "nonzero_ids")
    overrides = OmegaConf.load(tmp_path / "records" / "yoso-32-seed1" / "overrides.yaml")
    assert "row=yoso_table3/yoso_32" in overrides and "seed=1" in overrides and "trainer.max_steps=2" in overrides


def check_in_process(capsys, *args):
    """``lra-gpu-check *args`` in this process: (exit status, standard output, its last line on standard error)."""
    status, printed, errors = main_in_process(gpu_check.main, args, capsys)
    return status, printed, (errors.strip().splitlines() or [""])[-1]


def test_reference_slice_options_are_checked_before_anything_runs(tmp_path, capsys):
    def refused(*args):
        status, _, line = check_in_process(capsys, *args, "--out", str(tmp_path / "o"))
        assert status == 2 and not (tmp_path / "o").exists(), (status, line)
        return line

    assert "--rows sofmax: not a row of conf/row/yoso_table3; the rows are linformer," in refused(
        "--reference", "--rows", "softmax,sofmax")
    assert "--seeds x: not a whole number >= 0" in refused("--reference", "--seeds", "0,x")
    assert "--seeds -1: not a whole number >= 0" in refused("--reference", "--seeds", "-1")
    assert "--seeds ²: not a whole number >= 0" in refused("--reference", "--seeds", "²")  # isdigit(), not int(): a bug line
    assert "--runs-per-process ²: it must be a whole number" in refused("--reference", "--runs-per-process", "²")
    assert "--rows, --sweep-dir: only for the --reference runs; add --reference" in refused(
        "--rows", "softmax", "--sweep-dir", str(tmp_path / "s"))
    assert "overrides: only for the --reference runs; add --reference" in refused("--", "trainer.max_steps=3")
    # an empty shell variable is refused, not read as "every row" (12 rows x 5,000 steps) or as no limit
    assert refused("--reference", "--rows", "").endswith("--rows '' is empty (an unset shell variable?); name at "
                                                         "least one, or leave --rows out (default: " +
                                                         ",".join(gpu_check.table3_rows()) + ")")
    assert "--seeds '' is empty (an unset shell variable?)" in refused("--reference", "--seeds", "")
    assert "--seeds ' , ' has an empty item" in refused("--reference", "--seeds", " , ")
    assert "--rows 'softmax,,yoso_32' has an empty item" in refused("--reference", "--rows", "softmax,,yoso_32")
    assert "--rows lists softmax more than once" in refused("--reference", "--rows", "softmax,yoso_32,softmax")
    assert "--seeds lists 0 more than once" in refused("--reference", "--seeds", "0,1,0")
    for limit in ("nan", "inf", "-inf", "0", "-5", "1e999", "1e-9", "0.5"):
        assert "it must be a finite number of seconds ≥ 1 (no run starts in less)" in refused(
            "--reference", f"--limit-s={limit}"), limit
    (tmp_path / "a-file").write_text("")  # --out checked under --plan as in the real run
    status, printed, line = check_in_process(capsys, "--reference", "--plan", "--out", str(tmp_path / "a-file"))
    assert status != 0 and printed == "" and line.startswith("error: --out: "), (status, line)
    assert "--quick makes the check's own steps small" in refused("--reference", "--quick")
    status, printed, _ = check_in_process(capsys, "--reference", "--rows", "yoso_e", "--seeds", "2", "--limit-s",
                                          "540", "--plan")
    assert status == 0 and "row=yoso_table3/yoso_e seed=2 " in printed
    assert printed.strip().endswith(f"in all: 540 s at most (a step cut at its limit has "
                                    f"{gpu_check.REFERENCE_GRACE_S} s more to stop)")
    assert "reference ListOps: 540 s (1 job: 1 row x seeds 2, packed in one process, as many at a time as the GPU " \
           "holds)" in printed and " hydra/launcher=packed hydra.launcher.runs_per_process=auto " in printed
    status, printed, _ = check_in_process(capsys, "--reference", "--rows", "yoso_e", "--runs-per-process", "03", "--plan")
    assert status == 0 and "(1 job: 1 row x seeds 0, packed in one process, 1 at a time)" in printed
    assert " hydra.launcher.runs_per_process=3 " in printed  # the launcher caps it at the jobs of each pack
    assert "--runs-per-process 0: it must be a whole number >= 1 or auto" in refused("--reference", "--runs-per-process", "0")
    assert "--runs-per-process: only for the --reference runs" in refused("--runs-per-process", "2")
    assert "give one" in refused("--reference", "--runs-per-process", "2", "--jobs-per-gpu", "2")
    status, printed, _ = check_in_process(capsys, "--reference", "--rows", "softmax,yoso_32", "--seeds", "007,1",
                                          "--jobs-per-gpu", "100000", "--plan")
    assert status == 0 and " seed=7,1 " in printed and "hydra.launcher.jobs_per_gpu=4 " in printed
    assert "(4 jobs: 2 rows x seeds 7,1, 4 jobs per GPU)" in printed
    assert "--seeds lists 0 more than once" in refused("--reference", "--seeds", "0,00")


def test_a_slice_s_overrides_are_refused_with_lra_train_s_own_line_before_anything_runs(tmp_path, capsys, data_dir):
    """Each job of the slice is composed and validated as lra-train validates it: the same line, exit 2, in
    --plan and in a real run alike, with no output folder made and nothing started."""
    job = ["experiment=yoso_table3", "task=listops", "row=yoso_table3/yoso_32", "seed=0", "trainer.device=cpu",
           "logger=none"]
    out, sweep = tmp_path / "o", tmp_path / "s"
    run = ["--device", "cpu", "--sweep-dir", str(sweep), "--out", str(out)]
    for mistake, modes in ((["trainer.max_step=3"], (["--plan"], run)), (["attention.num_hashs=8"], (["--plan"], run)),
                           (["trainer.lr=-1"], (["--plan"],))):
        train = run_command(["lra-train", "--cfg", "job", *job, *mistake], tmp_path, data_dir, check=False)
        assert train.returncode == 2, (mistake, train.stdout, train.stderr)
        expected = train.stderr.strip().splitlines()[-1]
        assert expected.startswith("error: ") and "Traceback" not in train.stderr
        for mode in modes:  # the first job is yoso_32's: its keys are the ones suggested
            status, printed, line = check_in_process(capsys, "--reference", "--rows", "yoso_32,softmax", *mode, "--",
                                                     "trainer=smoke", *mistake)
            assert (status, line, printed) == (2, expected, ""), (mistake, mode)
    assert not out.exists() and not sweep.exists()

    def refused(*overrides, seeds="0"):
        status, printed, line = check_in_process(capsys, "--reference", "--seeds", seeds, "--plan", "--", *overrides)
        assert (status, printed) == (2, ""), line
        return line

    assert refused("trainer.lr=0.001,-1").startswith("error: invalid value for trainer.lr: -1.0;")  # a sweep's 2nd job
    assert refused("+trainer.foo=1").startswith("error: unknown key 'trainer.foo'; valid keys under trainer: batch_size,")
    assert refused("attention=nope").startswith("error: unknown choice 'nope' for attention (did you mean 'none'?); valid:")
    assert refused("trainer.max_steps=abc").startswith("error: invalid value for trainer.max_steps: Value 'abc' of type")
    assert refused("hydra.job.chdr=true") == ("error: unknown key 'hydra.job.chdr' (did you mean 'chdir'?); valid keys "
                                              "under hydra.job: chdir, config, config_name, env_copy, env_set, id, name, "
                                              "num, override_dirname")
    assert refused(seeds="4294967296").startswith("error: invalid value for seed: 4294967296; it must be a whole number")
    assert refused("").startswith("error: an override is empty ('': an unset shell variable?)")
    assert refused("--cfg").startswith("error: cannot parse the override '--cfg'")
    assert refused("trainer.lr=interval(0.1,0.2)") == ("error: BasicSweeper does not support sweep type : INTERVAL_SWEEP; "
                                                       "a slice sweeps lists of values: a,b,c, range(...) or choice(...) "
                                                       "(e.g. trainer.lr=0.001,0.002)")
    assert refused("seed=3") == ("error: the override 'seed=3' sets what lra-gpu-check --reference sets itself: use "
                                 "--seeds")
    assert refused("hydra.sweep.dir=/tmp/x").endswith("sets itself: use --sweep-dir")
    assert refused("hydra.launcher.n_jobs=64").endswith("sets itself: use --runs-per-process or --jobs-per-gpu")
    assert refused("trainer.device=cuda").endswith("sets itself: use --device")
    assert refused("hydra.sweeper.params.trainer.lr=0.1").endswith("sets itself: a slice's jobs are --rows x --seeds x "
                                                                   "the sweeps in its overrides (e.g. trainer.lr=0.1,0.2)")
    assert refused("task=text").endswith("a slice is always task=listops (another task: lra-train -m "
                                         "experiment=yoso_table3 task=<it>)")
    assert "continues a slice" in refused(f"resume={tmp_path}")
    status, printed, _ = check_in_process(capsys, "--reference", "--rows", "softmax,yoso_32", "--plan", "--",
                                          "task.generator.num_train=64", "trainer.lr=0.001,0.002")
    assert status == 0 and "(4 jobs: 2 rows x seeds 0, packed in one process, as many at a time as the GPU holds)" in printed


def test_a_sweep_dir_that_cannot_take_the_slice_is_refused_with_one_line_naming_the_fix(tmp_path, capsys, monkeypatch):
    def refused(sweep, *extra, status=2):
        code, printed, line = check_in_process(capsys, "--device", "cpu", "--reference", "--rows", "softmax",
                                               "--sweep-dir", str(sweep), "--out", str(tmp_path / "o"), *extra,
                                               "--", "trainer=smoke", "trainer.max_steps=50")
        assert (code, printed) == (status, "") and not (tmp_path / "o").exists(), line
        return line

    (tmp_path / "file").write_text("not a folder")
    assert refused(tmp_path / "file", status=1) == (f"error: --sweep-dir: {tmp_path / 'file'} is a file, not a folder; "
                                                    "give --sweep-dir another folder (a missing one is created)")
    other = tmp_path / "other"
    other.mkdir()
    saved = ["experiment=yoso_table3", "task=listops", "row=yoso_table3/softmax,yoso_table3/yoso_32", "seed=0,1",
             "trainer.device=cuda", "logger=none", "trainer=smoke", "trainer.max_steps=100"]
    OmegaConf.save({"hydra": {"overrides": {"task": saved}}}, other / "multirun.yaml")
    assert refused(other) == (f"error: --sweep-dir {other} holds another slice, made by: lra-gpu-check --reference "
                              f"--device cuda --rows softmax,yoso_32 --seeds 0,1 --runs-per-process auto --sweep-dir {other} "
                              f"-- trainer=smoke trainer.max_steps=100; continue it with that command, or give --sweep-dir a new folder")
    OmegaConf.save({"hydra": {"overrides": {"task": ["attention=softmax,yoso", "seed=0"]}}}, other / "multirun.yaml")
    assert refused(other).endswith("holds a sweep lra-gpu-check did not make (lra-train -m attention=softmax,yoso "
                                   "seed=0); give --sweep-dir a new or empty folder")
    status, printed, line = check_in_process(capsys, "--reference", "--rows", "softmax", "--sweep-dir", str(other),
                                             "--plan", "--", "trainer=smoke")
    assert (status, printed) == (2, "") and "holds a sweep lra-gpu-check did not make" in line  # --plan too
    (other / "multirun.yaml").write_text("hydra: [unclosed\n")
    assert refused(other, status=1).startswith(f"error: --sweep-dir {other}: its multirun.yaml is unreadable (ParserError")
    (other / "multirun.yaml").unlink()
    (other / "notes.txt").write_text("mine")
    assert refused(other) == (f"error: --sweep-dir {other} holds files but no sweep (no multirun.yaml); give "
                              "--sweep-dir a new or empty folder")
    assert (other / "notes.txt").read_text() == "mine"
    line = refused(tmp_path / "s", "--out", str(tmp_path / "s" / "out"), status=1)
    assert line.endswith("lie one inside the other (lra-table would count the packed records as runs of the slice): "
                         "give them separate folders")
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))  # lra-train would refuse it only once the slice ran
    assert refused(tmp_path / "data" / "listops" / "slice", status=1) == (
        f"error: --sweep-dir: {tmp_path / 'data' / 'listops' / 'slice'} is inside the listops data folder "
        f"{tmp_path / 'data' / 'listops'}, which lra-train reads; give --sweep-dir a folder outside it")
    assert refused(tmp_path / "data", status=1).startswith(f"error: --sweep-dir: {tmp_path / 'data'} is a folder")


def test_a_step_s_error_line_is_on_the_console_not_only_in_summary_md(tmp_path, data_dir):
    """The slice's run meets a full disk as it writes its first checkpoint: the check says the sweep's line
    on its console."""
    done = run_command(["lra-gpu-check", "--device", "cpu", "--reference", "--rows", "softmax", "--sweep-dir",
                        str(tmp_path / "slice"), "--out", str(tmp_path / "o"), "--", *SMOKE], tmp_path, data_dir,
                       env_extra={"LRA_FAULT": "checkpoint_write:1:ENOSPC"}, check=False)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if " said: " in line]
    assert said == ["[lra-gpu-check] reference ListOps said: error: 1 of the sweep's 1 runs failed; the table above "
                    f"and {tmp_path / 'slice' / 'table.md'} list each with its error (its record and train.log say "
                    "more)"], done.stdout
    assert "No space left on device" in (tmp_path / "slice" / "table.md").read_text()


LAUNCHER = """#!{python} -S
# The step's first process in place of lra-train (which it runs, passing its output on): it holds the check
# (SIGSTOP) until the runs have reached the trigger line, or sends the check a signal there.
import os, signal, subprocess, sys
check, action, trigger, count = os.getppid(), os.environ["WRAP_ACTION"], os.environ["WRAP_TRIGGER"], int(os.environ["WRAP_COUNT"])
if action == "hold":
    os.kill(check, signal.SIGSTOP)
child = subprocess.Popen([{lra_train!r}, *sys.argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(number, signal.SIG_IGN)  # the step's group is stopped: that signal is lra-train's to take
seen = 0
try:
    for line in child.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        seen += trigger.encode() in line
        if seen == count and trigger:
            trigger = ""
            os.kill(check, signal.SIGCONT if action == "hold" else getattr(signal, action))
finally:
    os.kill(check, signal.SIGCONT)
sys.exit(child.wait())
"""
DRIVER = """import sys
from lra.commands import gpu_check
tool = gpu_check._tool
gpu_check._tool = lambda name: sys.argv[1] if name == "lra-train" else tool(name)
sys.exit(gpu_check.main(sys.argv[2:]))
"""
CHAIN = ["trainer=smoke", "trainer.max_steps=8", "trainer.eval_every=2", "trainer.checkpoint_every=2",
         "trainer.log_every=1", *SMALL_LISTOPS]


def alone(root: Path, data_dir: Path, device: str, overrides: list) -> Path:
    """The run of ``overrides`` uninterrupted, on as many CPU threads as a slice's run recorded in ``device``
    (joblib gives each local_gpus worker the cores ÷ its jobs; a float sum on other threads may round otherwise)."""
    threads = re.search(r"(\d+) threads", device).group(1)
    return one_run(root, data_dir, overrides, env_extra={"OMP_NUM_THREADS": threads})


def test_a_slice_cut_at_its_limit_or_stopped_by_sigterm_records_why_and_the_same_command_resumes_it_exactly(
        tmp_path, data_dir):
    """Both runs of a slice stop themselves at a known step (LRA_FAULT=step:3:SIGSTOP: frozen, as a suspended
    job is), so the stop meets them there: the first time the slice's --limit-s cuts it (the check is held
    until then, so the limit falls due while the runs are frozen), the second time SIGTERM to lra-gpu-check
    itself stops it. Each time every run records `interrupted` and why (its checkpoint from two steps
    before kept), and the same command resumes them: the runs end equal to one run never interrupted."""
    launcher = tmp_path / "lra-train"
    launcher.write_text(LAUNCHER.format(python=sys.executable, lra_train=gpu_check._tool("lra-train")))
    launcher.chmod(0o755)
    sweep = tmp_path / "sweep"

    def check(out, limit_s, **wrap):
        env = environment(data_dir, **{"WRAP_ACTION": "", "WRAP_TRIGGER": "", "WRAP_COUNT": "0", **wrap})
        return subprocess.run([sys.executable, "-c", DRIVER, str(launcher), "--device", "cpu", "--reference",
                               "--rows", "softmax,yoso_32", "--jobs-per-gpu", "2", "--sweep-dir", str(sweep),
                               "--limit-s", str(limit_s), "--out", str(tmp_path / out), "--", *CHAIN],
                              capture_output=True, text=True, timeout=600, env=env, preexec_fn=shell_signal_handling)

    def records():
        return {path.parent.name: json.loads(path.read_text()) for path in sweep.glob("*/metrics.json")}

    def frozen_at(step):  # the third step each process trains: step 3, or step 5 after a resume at step 2
        return {"LRA_FAULT": "step:3:SIGSTOP", "WRAP_TRIGGER": f"step {step}/8 ", "WRAP_COUNT": "2"}

    cut = check("cut", 5, WRAP_ACTION="hold", **frozen_at(3))
    assert cut.returncode == 1, cut.stdout[-3000:] + cut.stderr[-3000:]
    assert "[lra-gpu-check] reference ListOps: timed out after 5 s" in cut.stdout
    assert "said: error: interrupted (SIGTERM: the slice's time limit, --limit-s 5)" in cut.stdout
    assert sorted(records()) == ["0", "1"]
    for record in records().values():
        assert (record["status"], record["signal"]) == ("interrupted", "SIGTERM"), record
        assert record["error"] == "interrupted (SIGTERM: the slice's time limit, --limit-s 5)"
    assert "the same command continues the slice in" in (tmp_path / "cut" / "summary.md").read_text()
    assert all((sweep / job / "checkpoints" / "last.pt").is_file() for job in ("0", "1"))

    stopped = check("stopped", 300, WRAP_ACTION="SIGTERM", **frozen_at(5))
    assert stopped.returncode == 128 + 15, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    errors = stopped.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: interrupted (SIGTERM); the steps that finished are "
                                                      "summarized in "), stopped.stderr
    assert errors[0].endswith("; continue the slice with the same command")
    for record in records().values():
        assert (record["status"], record["error"], record["resumed_at_steps"]) == (
            "interrupted", "interrupted (SIGTERM)", [2]), record
    with tarfile.open(tmp_path / "stopped" / "reference-records.tar.gz") as archive:
        packed = {name: json.load(archive.extractfile(name)) for name in archive.getnames() if name.endswith(".json")}
    assert sorted(packed) == ["softmax-seed0/metrics.json", "yoso-32-seed0/metrics.json"]
    assert all(record["status"] == "interrupted" for record in packed.values())

    done = check("done", 300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "runs: 2 completed" in (tmp_path / "done" / "reference.md").read_text()
    resumed = records()
    assert [resumed[job]["resumed_at_steps"] for job in ("0", "1")] == [[2, 4], [2, 4]]
    once = alone(tmp_path / "once", data_dir, resumed["0"]["device"], ["experiment=yoso_table3", "task=listops",
                 "row=yoso_table3/softmax", "seed=0", "trainer.device=cpu", "logger=none", *CHAIN])
    uninterrupted = json.loads((once / "metrics.json").read_text())
    assert uninterrupted["device"] == resumed["0"]["device"]
    for field in ("steps", "best_step", "best_val_accuracy", "test_accuracy", "test_loss"):
        assert resumed["0"][field] == uninterrupted[field], field
    assert json.loads((sweep / "0" / "history.json").read_text()) == json.loads((once / "history.json").read_text())


def test_every_folder_the_check_gives_hydra_parses_back_to_itself(tmp_path):
    """A TMPDIR with a space or a comma made the profile step's hydra.run.dir a sweep and the sweep step's
    hydra.sweep.dir 'Sweeping over Hydra's configuration'."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    scratch = tmp_path / "t m,p"
    overrides = [argument for step in gpu_check.plan("cpu", True, None, scratch) for argument in step.command
                 if argument.startswith(("hydra.run.dir=", "hydra.sweep.dir="))]
    assert len(overrides) == 2
    for override in overrides:
        parsed = OverridesParser.create().parse_override(override)
        assert not parsed.is_sweep_override() and str(scratch) in parsed.value(), override
