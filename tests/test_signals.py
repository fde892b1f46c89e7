"""One signal policy (lra/signals.py): SIGINT, SIGTERM and SIGHUP end every command and every stage with
a record that says ``interrupted`` with the signal's name, one ``error:`` line and exit 128 + the
signal's number, and the run resumes to exactly the uninterrupted result; a sweep stops whole, each
job it was running recorded; a SIGKILL's ``running`` record is reported by lra-table as unfinished.
Signals are delivered at deterministic points through lra/faults.py's hooks (no sleeps)."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys

import pytest
import torch

from command_server import shell_signal_handling
from conftest import SMALL_LISTOPS, one_run, read_json, run_command, run_dirs

# One layer: what a signal does to a run does not depend on the model's depth, and every run here costs half.
RESUMABLE = ["trainer=smoke", "trainer.max_steps=6", "trainer.eval_every=3", "trainer.checkpoint_every=3",
             "attention=softmax", "seed=3", "model.num_layers=1", *SMALL_LISTOPS]
SPT = ["trainer=smoke", "trainer.max_steps=6", "trainer.eval_every=3", "trainer.checkpoint_every=3",
       "trainer.train_subset=null", "trainer.eval_subset=null", "attention=softmax", "seed=5", "pretrain=masked",
       "model.num_layers=1", *SMALL_LISTOPS]
SHORT = ["trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "trainer.checkpoint_every=2",
         "model.num_layers=1", *SMALL_LISTOPS]
COMPARED = ("steps", "best_step", "best_val_accuracy", "test_accuracy")


def error_lines(result):
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def assert_one_line(result, code, start):
    """Exit ``code``, stderr ending with exactly one ``error:`` line that starts with ``start``, no traceback."""
    lines = error_lines(result)
    assert result.returncode == code, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith(start), result.stderr
    assert result.stderr.strip().splitlines()[-1] == lines[0], "the error line is the last word"
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


def final_state(run):
    weights = torch.load(run / "checkpoints" / "last.pt", weights_only=False)["model"]
    return read_json(run / "metrics.json"), read_json(run / "history.json"), weights


def assert_same_result(run, expected):
    metrics, history, weights = final_state(run)
    expected_metrics, expected_history, expected_weights = expected
    assert metrics["status"] == "completed" and metrics["error"] is None and "signal" not in metrics
    for key in COMPARED:
        assert metrics[key] == expected_metrics[key], key
    assert history == expected_history
    for name, tensor in expected_weights.items():
        assert torch.equal(weights[name], tensor), name
    assert not list(run.rglob("*.tmp")), "no temporary file survives"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    return final_state(one_run(tmp_path_factory.mktemp("uninterrupted"), data_dir, RESUMABLE))


# (faults, the signal the record names, exit status, the console's words). Each chain interrupts one run at
# its points in turn, a resume between them (fault counts start again in each process), then resumes it to the
# end: every point is checked as alone, and the run resumes exactly after several interruptions, with two
# commands fewer than a run per point.
CHAINS = {
    "SIGTERM between steps (ctrl-C while it stops), then two SIGHUPs (a terminal closing)": [
        ("step:3:SIGTERM,stopping:1:SIGINT", "SIGTERM", 143, "interrupted (SIGTERM)"),  # before step 3's checkpoint
        ("step:5:SIGHUP,stopping:1:SIGHUP", "SIGHUP", 129, "interrupted (SIGHUP)"),  # after it: resumes from step 3
    ],
    "SIGTERM inside a checkpoint write, then during validation": [
        ("checkpoint_write:2:SIGTERM", "SIGTERM", 143, "interrupted (SIGTERM)"),  # step 3's last.pt, not yet renamed
        ("eval_batch:8:SIGTERM", "SIGTERM", 143, "interrupted (SIGTERM)"),  # step 6's validation, its 2nd batch
    ],
}


@pytest.mark.parametrize("chain", CHAINS)
def test_a_signal_is_recorded_as_interrupted_and_the_run_resumes_exactly(tmp_path, data_dir, uninterrupted, chain):
    run = tmp_path / "runs" / "run"
    command = ["lra-train", *RESUMABLE, f"hydra.run.dir={run}"]
    for faults, name, code, words in CHAINS[chain]:
        stopped = run_command(command, tmp_path, data_dir, env_extra={"LRA_FAULT": faults}, check=False)
        line = assert_one_line(stopped, code, f"error: {words}")
        assert line.endswith(f"resume it with: lra-train resume={run}"), line
        record = read_json(run / "metrics.json")
        assert (record["status"], record["signal"], record["error"]) == ("interrupted", name, words), faults
        assert f"error: {words}" in (run / "train.log").read_text(), "the run's log says why it stopped"
        command = ["lra-train", f"resume={run}"]
    run_command(command, tmp_path, data_dir)
    assert run_dirs(tmp_path) == [run]
    assert_same_result(run, uninterrupted)


@pytest.fixture(scope="module")
def uninterrupted_spt(tmp_path_factory, data_dir):
    return final_state(one_run(tmp_path_factory.mktemp("spt"), data_dir, SPT))


def test_signals_in_both_stages_of_pretraining_are_recorded_and_it_resumes_exactly(tmp_path, data_dir, uninterrupted_spt):
    """SIGTERM in stage 1, then (resumed) SIGHUP while its encoder is written, then (resumed: stage 1 finishes
    its encoder, no step of its own left) SIGTERM in stage 2 after its step 3 checkpoint, then the run to its end."""
    run = tmp_path / "runs" / "run"
    encoder = run / "pretrain" / "encoder.pt"
    command = ["lra-train", *SPT, f"hydra.run.dir={run}"]
    for fault, name in (("step:2:SIGTERM", "SIGTERM"), ("checkpoint_write:3:SIGHUP", "SIGHUP")):
        stopped = run_command(command, tmp_path, data_dir, env_extra={"LRA_FAULT": fault}, check=False)
        assert_one_line(stopped, 128 + getattr(signal, name), f"error: interrupted ({name})")
        record = read_json(run / "metrics.json")
        assert (record["status"], record["signal"]) == ("interrupted", name)
        assert record["pretrain_status"] == "interrupted", "stage 1's own status says it was the stage interrupted"
        # a signal while the encoder is written is raised once it is whole: stage 1 is not recorded as ended
        assert not (run / "pretrain" / "finished.json").exists() and encoder.exists() == (name == "SIGHUP")
        command = ["lra-train", f"resume={run}"]
    # Stage 1 resumes at its last step: the step faults this process passes are stage 2's.
    stopped = run_command(command, tmp_path, data_dir, env_extra={"LRA_FAULT": "step:4:SIGTERM"}, check=False)
    line = assert_one_line(stopped, 143, "error: interrupted (SIGTERM)")
    assert line.endswith(f"resume it with: lra-train resume={run}"), line
    record = read_json(run / "metrics.json")
    assert (record["status"], record["signal"], record["error"]) == ("interrupted", "SIGTERM", "interrupted (SIGTERM)")
    assert (record["pretrain_status"], record["pretrain_steps"], record["steps"]) == ("completed", 6, 3), \
        "stage 1 finished: stage 2 was interrupted, past its step 3"
    written = encoder.read_bytes()
    assert hashlib.sha256(written).hexdigest() == record["pretrain_encoder_sha256"]
    run_command(command, tmp_path, data_dir)
    assert_same_result(run, uninterrupted_spt)
    record = read_json(run / "metrics.json")
    assert record["pretrain_status"] == "completed" and record["resumed_at_steps"] == [3], record["resumed_at_steps"]
    assert encoder.read_bytes() == written, "stage 2's resume fine-tunes the encoder stage 1 wrote, unchanged"


def test_a_signal_stops_a_sweep_whose_jobs_keep_their_records_and_the_same_command_continues_it(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    args = ["lra-train", "-m", "seed=0,1,2", *SHORT, f"hydra.sweep.dir={sweep}"]
    stopped = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "step:7:SIGTERM"}, check=False)  # job 1
    line = assert_one_line(stopped, 143, "error: interrupted (SIGTERM); the sweep stopped at job 1")
    assert f"hydra.sweep.dir={sweep}" in line
    assert read_json(sweep / "0" / "metrics.json")["status"] == "completed"
    record = read_json(sweep / "1" / "metrics.json")
    assert (record["status"], record["signal"], record["steps"]) == ("interrupted", "SIGTERM", 2)
    assert not (sweep / "2").exists(), "no job starts once the sweep is interrupted"
    table = run_command(["lra-table", str(sweep)], tmp_path, data_dir).stdout
    assert "(1; " in table and "1 unfinished" in table and "runs: 1 completed, 1 interrupted" in table
    assert f"unfinished runs (1):\n- {sweep / '1'}: interrupted (SIGTERM) at step 2; resume with: " \
           f"lra-train resume={sweep / '1'}" in table, table
    run_command(args, tmp_path, data_dir)
    records = [read_json(sweep / str(job) / "metrics.json") for job in range(3)]
    assert [r["status"] for r in records] == ["completed"] * 3
    assert [r["resumed_at_steps"] for r in records] == [[], [2], []], "the interrupted job resumed, no other"
    table = (sweep / "table.md").read_text()
    assert " unfinished)" not in table and "unfinished runs" not in table, table  # (the legend names the word)


def test_a_signal_to_one_worker_of_a_local_gpus_sweep_stops_every_job_with_its_record(tmp_path, data_dir):
    """hydra/launcher=local_gpus: jobs in worker processes. One worker's SIGTERM reaches the sweep, which
    passes it on to the other worker: both running jobs record interrupted, then the sweep ends (143). The
    jobs are long (1,000 steps; both stop near step 3): with SHORT's 4 steps the other job could finish
    before the signal reached it when the workers started far apart (a loaded machine), and record
    completed."""
    sweep = tmp_path / "sweep"
    long = [o for o in SHORT if not o.startswith("trainer.max_steps=")] + ["trainer.max_steps=1000"]
    stopped = run_command(["lra-train", "-m", "hydra/launcher=local_gpus", "hydra.launcher.n_jobs=2", "seed=0,1",
                           *long, f"hydra.sweep.dir={sweep}"], tmp_path, data_dir,
                          env_extra={"LRA_FAULT": "step:3:SIGTERM", "LRA_FAULT_ONCE": str(tmp_path / "once")},
                          check=False)
    line = assert_one_line(stopped, 143, "error: interrupted (SIGTERM); the sweep stopped")
    assert f"hydra.sweep.dir={sweep.resolve()}" in line
    records = [read_json(sweep / str(job) / "metrics.json") for job in (0, 1)]
    assert [(r["status"], r["signal"]) for r in records] == [("interrupted", "SIGTERM")] * 2, records


def test_a_killed_run_stays_running_and_lra_table_reports_it_unfinished_with_its_resume_command(tmp_path, data_dir):
    killed = run_command(["lra-train", *SHORT, "hydra.run.dir=runs/killed"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "step:3"}, check=False)
    assert killed.returncode == -signal.SIGKILL
    done = tmp_path / "runs" / "done"  # a finished seed beside it in the table: its record is all lra-table reads
    done.mkdir()
    (done / "metrics.json").write_text('{"label": "Softmax", "task": "listops", "seed": 1, "status": "completed", '
                                       '"steps": 4, "test_accuracy": 12.5}')
    run = tmp_path / "runs" / "killed"
    assert read_json(run / "metrics.json")["status"] == "running", "SIGKILL cannot be caught"
    table = run_command(["lra-table", str(tmp_path / "runs")], tmp_path, data_dir).stdout
    assert "**12.50** (1, 1 unfinished)" in table, "counted as unfinished in its cell, not as a result"
    assert f"- {run}: killed while running (its process is gone) at step 2; resume with: lra-train resume={run}" \
        in table, table
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    table = run_command(["lra-table", str(tmp_path / "runs")], tmp_path, data_dir).stdout
    assert " unfinished)" not in table and "unfinished runs" not in table, table  # (the legend names the word)


def test_sigterm_in_lra_prepare_is_one_line_and_leaves_no_staging_folder(tmp_path, data_dir):
    data = tmp_path / "data"
    generate = [o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]
    result = run_command(["lra-prepare", "listops", "--data-dir", str(data), *generate], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "cache_example:30:SIGTERM"}, check=False)
    assert_one_line(result, 143, "error: interrupted (SIGTERM); what was finished is kept")
    assert [p for p in data.rglob("*") if p.name.startswith(".")] == [] and not list(data.rglob("manifest.json"))


# ------------------------------------------------------------------ the policy itself, in a fresh interpreter
def policy(body: str, ignore=()) -> subprocess.CompletedProcess:
    """Run ``body`` (with ``signals``, ``os``, ``signal`` imported) under ``signals.interruptible()`` in a new
    Python whose ``ignore`` signals start ignored (as under nohup), the others as from an interactive shell
    (whatever this test run's own); its output and exit status."""
    code = ("import os, signal, sys\nfrom lra import signals\n"
            f"for number in {[int(s) for s in ignore]}:\n    signal.signal(number, signal.SIG_IGN)\n" + body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          preexec_fn=shell_signal_handling)


def test_the_first_signal_raises_with_its_status_and_a_later_one_cannot_cut_the_stop_short():
    result = policy("""
try:
    with signals.interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
        print("not reached")
except signals.Interrupted as stopped:
    os.kill(os.getpid(), signal.SIGINT)  # a second signal while stopping: ignored
    os.kill(os.getpid(), signal.SIGHUP)
    print(stopped.reason, stopped.signal_name, stopped.exit_code, isinstance(stopped, KeyboardInterrupt))
""")
    assert result.stdout.split("\n")[0] == "interrupted (SIGTERM) SIGTERM 143 True", result.stderr


def test_a_signal_during_a_record_write_is_raised_once_the_record_is_whole(tmp_path):
    result = policy(f"""
from lra import records
write = records.atomic_write_json
def signal_then_write(path, data):
    os.kill(os.getpid(), signal.SIGHUP)  # the signal arrives as the record is being written
    write(path, data)
records.atomic_write_json = signal_then_write
record = records.RunRecord({str(tmp_path)!r}, status="running")
with signals.interruptible():
    try:
        record.update(steps=5)
    except signals.Interrupted as stopped:
        print("raised after the write:", stopped.signal_name)
""")
    assert result.stdout.strip() == "raised after the write: SIGHUP", result.stderr
    assert read_json(tmp_path / "metrics.json")["steps"] == 5


def test_an_ignored_signal_stays_ignored_and_another_handler_stays_its_owners():
    """nohup's ignored SIGHUP is kept; a handler installed before (submitit's SIGTERM) is kept; the rest
    are taken over and given back when the block ends without a signal."""
    result = policy("""
signal.signal(signal.SIGTERM, lambda number, frame: print("their handler"))
with signals.interruptible():
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGTERM)
    print("still running;", signals.handles(signal.SIGINT), signals.handles(signal.SIGHUP))
print("given back:", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
""", ignore=[signal.SIGHUP])
    assert result.stdout.splitlines() == ["their handler", "still running; True False", "given back: True"], \
        result.stderr


def test_a_signal_while_a_command_starts_is_one_line_and_its_status_and_the_edge_takes_over_from_there():
    """A console command's imports take seconds (torch): a ctrl-C there was a KeyboardInterrupt traceback
    in some import, a SIGTERM or SIGHUP a silent death. Importing lra.commands (every console script's
    first import) puts the start-up under the policy; a library user's process keeps its own handlers."""
    started = subprocess.run([sys.executable, "-c", """
import os, signal, sys
sys.argv[0] = "/venv/bin/lra-table"
import lra.commands
from lra import signals
with signals.interruptible():
    print("the edge owns it:", signals.handles(signal.SIGTERM), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print("not reached")
"""], capture_output=True, text=True, timeout=60, preexec_fn=shell_signal_handling)
    assert started.stdout == "the edge owns it: True\n", started.stderr
    assert (started.returncode, started.stderr) == (143, "error: interrupted (SIGTERM); nothing was being written\n")
    library = subprocess.run([sys.executable, "-c", "import signal, lra.commands; "
                              "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"],
                             capture_output=True, text=True, timeout=60, preexec_fn=shell_signal_handling)
    assert library.stdout == "True\n", library.stderr
    ignored = policy("sys.argv[0] = 'lra-train'\nimport lra.commands\nos.kill(os.getpid(), signal.SIGHUP)\nprint('alive')",
                     ignore=[signal.SIGHUP])
    assert ignored.stdout == "alive\n", "nohup's ignored SIGHUP stays ignored"


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_in_the_interpreters_teardown_after_a_finished_command_is_ignored(number):
    """Once the exit handlers have run, Python's teardown puts its signal handlers back to the default
    action: a SIGTERM then (here from an object deleted in the teardown, as a late ``kill`` would land) ended a
    command that had done everything and printed its last line with 143 and no line. It is ignored there:
    the command ends with its own status."""
    ended = subprocess.run([sys.executable, "-c", f"""
import os, signal, sys
sys.argv[0] = "/venv/bin/lra-table"
import lra.commands
class Late:
    def __del__(self):
        os.kill(os.getpid(), {int(number)})
        os.write(1, b"the teardown went on\\n")
late = Late()
print("done", flush=True)
sys.exit(0)
"""], capture_output=True, text=True, timeout=60, preexec_fn=shell_signal_handling)
    assert (ended.returncode, ended.stdout, ended.stderr) == (0, "done\nthe teardown went on\n", "")


class _SignalledWhilePickled:
    """Sends this process SIGTERM while torch.save pickles it: a signal inside the zip writer."""

    def __reduce__(self):
        import os

        os.kill(os.getpid(), signal.SIGTERM)
        return (dict, ())


def test_a_signal_inside_torch_save_interrupts_after_the_checkpoint_is_whole(tmp_path):
    """Raised inside torch.save's zip writer, the signal's exception was replaced by the writer's own
    RuntimeError ("unexpected pos …"): the run recorded failed, "a bug in the harness", for a ctrl-C."""
    from lra import checkpoint, signals

    path = tmp_path / "last.pt"
    with pytest.raises(signals.Interrupted) as stopped:
        with signals.interruptible():
            checkpoint.save(path, {"weights": torch.arange(4.0), "odd": _SignalledWhilePickled()})
    assert stopped.value.signal_number == signal.SIGTERM
    assert torch.equal(checkpoint.load(path)["weights"], torch.arange(4.0))
