"""W&B offline: the run's offline file holds the config, the history and the summary, read back here
from the file itself (LevelDB-log framing of protobuf records, as wandb writes it)."""

from __future__ import annotations

import struct

from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from lra.wandb_log import problem

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_wandb_records(path):
    """Every protobuf ``Record`` of an offline ``run-*.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, "not a W&B transaction log"
    position, payload, records = 7, b"", []
    while position + 7 <= len(data):
        left = BLOCK - position % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += left
            continue
        payload += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(payload)
            records.append(record)
            payload = b""
    return records


def test_offline_run_holds_config_history_and_summary(tmp_path, data_dir):
    import json

    run_command(["lra-train", "trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "trainer.log_every=2",
                 "logger=wandb", "seed=5", *SMALL_LISTOPS], tmp_path, data_dir, env_extra={"WANDB_MODE": "offline"})
    (run_dir,) = run_dirs(tmp_path)
    by_kind = offline_records(run_dir)
    run = by_kind["run"][0].run
    assert run.display_name == "Softmax" and run.job_type == "listops"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["seed"] == 5 and config["task"]["name"] == "listops"
    assert_history_and_summary(run_dir, by_kind)


def test_the_runs_of_a_packed_sweep_log_side_by_side(tmp_path, data_dir):
    """hydra/launcher=packed: two runs of one process, each its own W&B run, neither finishing the other's."""
    run_command(["lra-train", "-m", "hydra/launcher=packed", "hydra.launcher.runs_per_process=2", "trainer=smoke",
                 "trainer.max_steps=4", "trainer.eval_every=2", "trainer.log_every=2", "logger=wandb", "seed=5,6",
                 *SMALL_LISTOPS], tmp_path, data_dir, env_extra={"WANDB_MODE": "offline"})
    runs = run_dirs(tmp_path)
    assert len(runs) == 2
    for run_dir in runs:
        assert_history_and_summary(run_dir, offline_records(run_dir))


def offline_records(run_dir):
    """The run's offline W&B records by kind, after lra-sync's check that the file is whole."""
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    assert problem(log) is None, "lra-sync's check reads wandb's own log as whole"
    by_kind = {}
    for record in read_wandb_records(log):
        by_kind.setdefault(record.WhichOneof("record_type"), []).append(record)
    return by_kind


def assert_history_and_summary(run_dir, by_kind):
    import json

    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
               for r in by_kind["history"]]
    validation = [(row["_step"], row["val/accuracy"]) for row in history if "val/accuracy" in row]
    expected = [(entry["step"], entry["val_accuracy"]) for entry in read_json(run_dir / "history.json")]
    assert validation == expected and len(expected) == 2
    assert all("train/loss" in row for row in history)

    summary = {}
    for record in by_kind["summary"]:
        summary.update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.summary.update})
    metrics = read_json(run_dir / "metrics.json")
    assert summary["test/accuracy"] == metrics["test_accuracy"] and summary["run_dir"] == str(run_dir)
    assert by_kind["exit"][0].exit.exit_code == 0


def test_a_sweeps_group_names_its_overrides_and_folder(tmp_path):
    from lra.loggers import sweep_group

    sweep = tmp_path / "runs" / "multirun" / "2026-11-23" / "10-31-07"
    sweep.mkdir(parents=True)
    assert sweep_group(sweep) == "2026-11-23/10-31-07"  # no multirun.yaml: the folder alone
    (sweep / "multirun.yaml").write_text("hydra:\n  overrides:\n    task:\n    - attention=softmax,yoso\n    - seed=0,1\n")
    assert sweep_group(sweep) == "attention=softmax,yoso seed=0,1 · 2026-11-23/10-31-07"
    (sweep / "multirun.yaml").write_text("hydra:\n  overrides:\n    task:\n    - seed=" + ",".join(map(str, range(60))) + "\n")
    long = sweep_group(sweep)
    assert len(long) == 128 and long.endswith("… · 2026-11-23/10-31-07") and long.startswith("seed=0,1,2")
