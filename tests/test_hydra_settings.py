"""Hydra settings that would write into a run folder before lra-train owns it, or read relative paths against
another folder, are one line before any folder is made; ``hydra.job.env_set`` takes new variables as Hydra means."""

import json

import pytest

from conftest import SMALL_LISTOPS, run_command

SHORT = ["trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2", *SMALL_LISTOPS]

REFUSED = [
    (["hydra/job_logging=default"], "hydra.job_logging.handlers.file (hydra/job_logging=default) writes a log file "
                                    "(${hydra.runtime.output_dir}/${hydra.job.name}.log), which Hydra opens as each "
                                    "job starts, before lra-train owns the run's folder"),
    # a handler of one's own, of a FileHandler class: caught by its class, wherever it writes
    (["+hydra.job_logging.handlers.mine.class=logging.handlers.RotatingFileHandler",
      "+hydra.job_logging.handlers.mine.filename=mine.log"], "hydra.job_logging.handlers.mine writes a log file "
                                                             "(mine.log)"),
    (["hydra.output_subdir=.hydra"], "hydra.output_subdir=.hydra has Hydra write its config files into the run folder "
                                     "before lra-train owns it"),
    # data_dir was read inside the run folder (ListOps generated again there), resume= looked for <run>/<run>
    (["hydra.job.chdir=true"], "hydra.job.chdir=true gives each job the working directory of its own (its run folder), "
                               "and lra-train reads relative paths"),
]


@pytest.mark.parametrize("overrides, expected", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_a_hydra_setting_that_writes_into_a_run_folder_is_one_line_before_any_folder(tmp_path, data_dir, overrides,
                                                                                      expected):
    """A refused config (another mistake too), a completed run's folder, a sweep and a dry run: the same line, exit
    2, and nothing written anywhere: Hydra's file log used to make the folder of a refused config, or append
    the refusal to the log of the run whose folder it was pointed at."""
    done = tmp_path / "done"  # a completed run's folder, as far as its files go
    (done / ".hydra").mkdir(parents=True)
    (done / "metrics.json").write_text(json.dumps({"status": "completed"}))
    (done / "train.log").write_text("the run's own log\n")
    (done / ".hydra" / "config.yaml").write_text("seed: 0\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    commands = [["trainer.lr=-1", f"hydra.run.dir={tmp_path / 'new'}"], [f"hydra.run.dir={done}"],
                ["-m", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}"], ["--cfg", "job"]]
    lines = set()
    for extra in commands:
        result = run_command(["lra-train", *SHORT, *overrides, *extra], tmp_path, data_dir, check=False)
        (line,) = result.stderr.strip().splitlines()
        assert result.returncode == 2 and line.startswith(f"error: {expected}") and result.stdout == "", (extra, line)
        lines.add(line)
    assert len(lines) == 1, lines
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before, "no file written or changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done"], "no folder made"


def test_a_variable_given_to_hydra_job_env_set_reaches_the_job(tmp_path, data_dir):
    """hydra.job.env_set is Hydra's free-form dict of the variables it sets for the job; a new name there was
    "unknown key …; valid keys under hydra.job.env_set:" (an empty list). The run reads the data folder the
    variable names, not the one its command started with."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run_command(["lra-train", *SHORT, f"hydra.job.env_set.LRA_DATA_DIR={data_dir}", f"hydra.run.dir={run}"], tmp_path,
                data_dir, env_extra={"LRA_DATA_DIR": str(elsewhere)})
    assert f"data_dir: {data_dir}\n" in (run / ".hydra" / "resolved.yaml").read_text()
    assert json.loads((run / "metrics.json").read_text())["status"] == "completed"
    assert list(elsewhere.iterdir()) == [], "the command's own LRA_DATA_DIR was not the job's"
