"""Self-pretraining (``pretrain=masked|causal``, lra/pretraining.py and lra/pretrainer.py): the masking,
the loss, causal attention for every backend that claims it, no leakage of labels or held-out inputs
into stage 1, the weight hand-over, exact resume in either stage, and ``pretrain.from``."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal

import numpy as np
import pytest
import torch

import attention_zoo
from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from helpers import compose_config
from lra.errors import ConfigError
from lra.pretraining import draw_masked, masking_draws, token_loss
from lra.validation import attention_spec, validate


@pytest.mark.parametrize("probability", [0.15, 0.5])
def test_masking_hits_its_rate_on_real_tokens_and_never_touches_padding(probability):
    lengths = torch.from_numpy(np.random.default_rng(0).integers(10, 300, size=64))
    real = torch.arange(300)[None, :] < lengths[:, None]
    indices = np.arange(100, 132)
    masked = draw_masked(real, probability, masking_draws(3, 11, indices, documents=2, length=300))
    assert not (masked & ~real).any(), "a padding position was masked"
    count = int(real.sum())
    rate = float(masked.sum()) / count
    assert abs(rate - probability) < 4 * math.sqrt(probability * (1 - probability) / count)  # 4 σ, fixed seed
    again = masking_draws(3, 11, indices, documents=2, length=300)
    assert torch.equal(masked, draw_masked(real, probability, again)), "a step's masks are redrawn exactly (resume)"
    assert not torch.equal(again, masking_draws(3, 12, indices, documents=2, length=300)), "each step draws anew"
    # an example's draws are its own, however the batch is split (processes, micro-batches)
    halves = [masking_draws(3, 11, part, documents=2, length=300) for part in (indices[:16], indices[16:])]
    assert torch.equal(again[:16], halves[0][:16]) and torch.equal(again[48:], halves[1][16:])


def test_the_loss_is_the_mean_over_sequences_of_each_ones_counted_positions():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=generator)
    targets = torch.randint(0, 11, (3, 7), generator=generator)
    counted = torch.rand(3, 7, generator=generator) < 0.4
    counted[2] = False  # a sequence with nothing to predict counts as 0
    loss, correct, predictions = token_loss(logits, targets, counted)
    log_probabilities = torch.log_softmax(logits.double(), dim=-1)
    per_sequence = []
    for b in range(3):
        terms = [-log_probabilities[b, t, targets[b, t]] for t in range(7) if counted[b, t]]
        per_sequence.append(sum(terms) / len(terms) if terms else 0.0)
    assert float(predictions) == int(counted.sum())
    assert float(loss) == pytest.approx(float(sum(per_sequence) / 3), rel=1e-6)
    logits.requires_grad_(True)
    token_loss(logits, targets, counted)[0].backward()
    assert not logits.grad[~counted].any(), "an uncounted position reached the loss"
    assert int(correct) == int(((logits.argmax(-1) == targets) & counted).sum())


@pytest.mark.parametrize("name", attention_zoo.names())
def test_a_causal_backend_never_sees_later_tokens_and_the_others_refuse(name):
    """Every backend that claims a causal mode: its output at positions ≤ t, and a causal language
    model's logits there, do not change when everything after t does. The others refuse, in the
    registry and as one config line."""
    if not attention_zoo.get(name).cls.supports_causal:
        with pytest.raises(ValueError, match="has no causal mode"):
            attention_zoo.build(name, num_heads=2, head_dim=8, max_seq_len=16, causal=True)
        with pytest.raises(ConfigError, match=f"attention={name} has no causal mode"):
            validate(compose_config(f"attention={name}", "pretrain=causal", *SMALL_LISTOPS))
        return
    from lra.model import LanguageModel

    generator = torch.Generator().manual_seed(1)
    options = {"window_size": 4, "num_global_tokens": 2} if name == "longformer" else {}
    backend = attention_zoo.build(name, num_heads=2, head_dim=8, max_seq_len=13, causal=True, **options).eval()
    q, k, v = (torch.randn(2, 2, 13, 8, generator=generator) for _ in range(3))
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, 10:] = False
    cut = 6
    later = [x.clone() for x in (q, k, v)]
    for x in later:
        x[:, :, cut + 1:] = torch.randn(x[:, :, cut + 1:].shape, generator=generator)
    torch.testing.assert_close(backend(q, k, v, mask)[:, :, :cut + 1], backend(*later, mask)[:, :, :cut + 1],
                               rtol=0, atol=0)
    shorter = mask.clone()
    shorter[0, cut + 2:] = False  # where the sequence ends is later information too
    torch.testing.assert_close(backend(q, k, v, mask)[:, :, :cut + 1], backend(q, k, v, shorter)[:, :, :cut + 1],
                               rtol=0, atol=0)

    cfg = compose_config(f"attention={name}", "pretrain=causal", "task.max_length=32", "model.dropout=0")
    torch.manual_seed(0)
    model = LanguageModel(cfg.model, cfg.task, attention_spec(cfg), 32, causal=True).eval()
    ids = torch.randint(1, 17, (2, 32), generator=generator)
    changed = ids.clone()
    changed[:, 20:] = torch.randint(1, 17, (2, 12), generator=generator)
    real = torch.ones(2, 32, dtype=torch.bool)
    before, after = model(ids, real), model(changed, real)
    torch.testing.assert_close(before[:, :20], after[:, :20], rtol=0, atol=0)
    assert not torch.equal(before[:, 20:], after[:, 20:])


STAGE_ONE = ["trainer=smoke", "trainer.max_steps=6", "trainer.eval_every=3", "trainer.checkpoint_every=3",
             "trainer.train_subset=null", "trainer.eval_subset=null", "attention=softmax", "seed=5", *SMALL_LISTOPS]


class Unreadable:
    """A validation or test split whose inputs must not be read (its size and labels may be)."""

    def __init__(self, split):
        self.labels, self._size = split.labels, len(split)

    def __len__(self):
        return self._size

    def gather(self, *args, **kwargs):
        raise AssertionError("stage 1 read a validation or test input")

    lengths = gather


@pytest.mark.parametrize("objective", ["masked", "causal"])
def test_stage_one_reads_only_training_inputs(tmp_path, data_dir, monkeypatch, objective):
    """With the validation and test inputs unreadable and the training labels shuffled (and with a
    held-out validation split carved from the training split), stage 1 trains exactly as it does on the
    untouched data: it reads training inputs and nothing else."""
    import lra.build
    from lra.pretrainer import Pretrainer

    cfg = compose_config(*STAGE_ONE, f"pretrain={objective}", "task.validation=heldout", "task.heldout_size=24",
                         f"data_dir={data_dir}")
    real_loader = lra.build.load_task_data

    def encoder_after_steps(poisoned: bool):
        if poisoned:
            def load(*args, **kwargs):
                data = real_loader(*args, **kwargs)
                train = data.splits["train"]
                train.labels = np.random.default_rng(9).permutation(train.labels)
                data.splits["val"], data.splits["test"] = Unreadable(data.splits["val"]), Unreadable(data.splits["test"])
                return data
            monkeypatch.setattr(lra.build, "load_task_data", load)
        stage = Pretrainer(cfg, tmp_path / f"run{poisoned}", announce=lambda m: None)
        assert len(stage.data.splits["train"]) == 96 - 24, "the held-out examples are not pretrained on"
        for _ in range(4):
            stage.train_step()
        return stage.model.encoder.state_dict()

    clean, poisoned = encoder_after_steps(False), encoder_after_steps(True)
    for name in clean:
        assert torch.equal(clean[name], poisoned[name]), name


@pytest.fixture(scope="module")
def uninterrupted_spt(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("spt")
    run_command(["lra-train", *STAGE_ONE, "pretrain=masked"], root, data_dir)
    (run,) = run_dirs(root)
    return run


def final_weights(run):
    return torch.load(run / "checkpoints" / "last.pt", weights_only=False)["model"]


def test_fine_tuning_starts_from_the_pretrained_encoder_bit_for_bit_with_a_fresh_head(uninterrupted_spt, data_dir):
    from lra.training import Trainer

    record = read_json(uninterrupted_spt / "metrics.json")
    assert record["label"] == "Softmax +SPT" and record["pretrain_objective"] == "masked"
    assert record["pretrain_status"] == "completed" and record["pretrain_steps"] == 6
    assert [h["step"] for h in record["pretrain_history"]] == [3, 6]
    assert record["status"] == "completed" and record["steps"] == 6
    encoder = torch.load(uninterrupted_spt / "pretrain" / "encoder.pt", weights_only=False)["encoder"]
    cfg = compose_config(*STAGE_ONE, "pretrain=masked", f"data_dir={data_dir}")
    fine_tune = Trainer(cfg, uninterrupted_spt.parent / "inspect", announce=lambda m: None)
    fresh_head = {k: v.clone() for k, v in fine_tune.model.head.state_dict().items()}
    scratch = Trainer(compose_config(*STAGE_ONE, f"data_dir={data_dir}"), uninterrupted_spt.parent / "scratch",
                      announce=lambda m: None)
    fine_tune.start_from_encoder(encoder)
    for name, tensor in encoder.items():
        assert torch.equal(fine_tune.model.encoder.state_dict()[name], tensor), name
        assert not torch.equal(scratch.model.encoder.state_dict()[name], tensor) or "position" in name or "norm" in name
    for name, tensor in scratch.model.head.state_dict().items():
        assert torch.equal(fresh_head[name], tensor), f"the head is a fresh one, as from scratch: {name}"


# (the fault, the pretrain_resumed_at_steps and resumed_at_steps its resume records): a kill anywhere from
# stage 1 to stage 2's first checkpoint, the stage's end included, resumes to the uninterrupted result with a
# record that says both stages completed and where it resumed. Stage 1 checkpoints at its steps 3 and 6.
KILLS = {
    "in stage 1": ("step:4", [3], []),
    "while the encoder is written": ("checkpoint_write:3", [6], []),  # no encoder: stage 1 ends again from step 6
    "after the encoder, before the stage's record of its end": ("encoder_written:1", [6], []),  # so does this one
    "after the stage's record of its end, before the run's": ("stage_recorded:1", [], [0]),  # stage 2 from step 0
    "in stage 2 before its first checkpoint": ("step:7", [], [0]),
    "in stage 2": ("step:10", [], [3]),
}


@pytest.mark.parametrize("fault,pretrain_resumed,resumed", KILLS.values(), ids=KILLS.keys())
def test_a_run_killed_in_either_stage_or_between_them_resumes_to_the_uninterrupted_result(
        tmp_path, data_dir, uninterrupted_spt, fault, pretrain_resumed, resumed):
    killed = run_command(["lra-train", *STAGE_ONE, "pretrain=masked"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": fault}, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (run,) = run_dirs(tmp_path)
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    record, expected = read_json(run / "metrics.json"), read_json(uninterrupted_spt / "metrics.json")
    for key in ("status", "pretrain_status", "steps", "best_val_accuracy", "test_accuracy", "pretrain_steps",
                "pretrain_loss", "pretrain_history", "pretrain_encoder_sha256", "label"):
        assert record[key] == expected[key], key
    assert (record["pretrain_resumed_at_steps"], record["resumed_at_steps"]) == (pretrain_resumed, resumed)
    assert not list(run.rglob("*.tmp")), "no temporary file may survive"
    expected_weights = final_weights(uninterrupted_spt)
    for name, tensor in final_weights(run).items():
        assert torch.equal(tensor, expected_weights[name]), name


def test_a_signal_after_the_encoder_is_written_is_raised_once_the_record_says_stage_one_finished(
        tmp_path, data_dir, uninterrupted_spt):
    """SIGTERM after the stage's own record of its end: held until metrics.json says so too, so the record of
    the interrupted run says stage 1 completed and stage 2 was interrupted; the resume completes it exactly."""
    stopped = run_command(["lra-train", *STAGE_ONE, "pretrain=masked"], tmp_path, data_dir,
                          env_extra={"LRA_FAULT": "stage_recorded:1:SIGTERM"}, check=False)
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert stopped.returncode == 143 and errors == [errors[-1]] and errors[0].startswith("error: interrupted (SIGTERM)")
    (run,) = run_dirs(tmp_path)
    record = read_json(run / "metrics.json")
    assert (record["status"], record["pretrain_status"], record["pretrain_steps"]) == ("interrupted", "completed", 6)
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    record, expected = read_json(run / "metrics.json"), read_json(uninterrupted_spt / "metrics.json")
    assert (record["status"], record["pretrain_status"], record["resumed_at_steps"]) == ("completed", "completed", [0])
    assert record["test_accuracy"] == expected["test_accuracy"]


def test_pretrain_from_fine_tunes_a_finished_stage_one_exactly_as_the_one_command_run(tmp_path, data_dir,
                                                                                        uninterrupted_spt):
    run_command(["lra-train", *STAGE_ONE, f"pretrain.from={uninterrupted_spt}"], tmp_path, data_dir)
    (run,) = run_dirs(tmp_path)
    record, source = read_json(run / "metrics.json"), read_json(uninterrupted_spt / "metrics.json")
    assert sorted(p.name for p in (run / "pretrain").iterdir()) == ["encoder.pt", "finished.json"], \
        "nothing is pretrained again"
    assert record["pretrain_from"] == str(uninterrupted_spt) and record["label"] == "Softmax +SPT"
    assert record["pretrain_encoder_sha256"] == source["pretrain_encoder_sha256"]
    assert record["test_accuracy"] == source["test_accuracy"]
    expected = final_weights(uninterrupted_spt)
    for name, tensor in final_weights(run).items():
        assert torch.equal(tensor, expected[name]), name
    # the run holds its own copy: it resumes (and is still whole) when the other run is gone
    (tmp_path / "copy").mkdir()
    relative = os.path.relpath(uninterrupted_spt, tmp_path / "copy")  # resolved when the run starts
    killed = run_command(["lra-train", *STAGE_ONE, f"pretrain.from={relative}"], tmp_path / "copy",
                         data_dir, env_extra={"LRA_FAULT": "step:4"}, check=False)
    assert killed.returncode == -signal.SIGKILL
    (copy,) = run_dirs(tmp_path / "copy")
    moved = uninterrupted_spt.parent / "moved"
    uninterrupted_spt.rename(moved)
    try:
        run_command(["lra-train", f"resume={copy}"], tmp_path, data_dir)
    finally:
        moved.rename(uninterrupted_spt)
    assert read_json(copy / "metrics.json")["test_accuracy"] == source["test_accuracy"]
    other = compose_config(*STAGE_ONE, "attention=yoso", f"pretrain.from={uninterrupted_spt}", f"data_dir={data_dir}")
    with pytest.raises(ConfigError, match="pretrained with another attention \\('softmax' there, 'yoso' here\\)"):
        validate(other)
    # a run that fine-tuned another's encoder is a source too: its objective is that encoder's (masked), not its
    # own config's pretrain=none, which the refusal named
    validate(compose_config(*STAGE_ONE, "pretrain=masked", f"pretrain.from={run}", f"data_dir={data_dir}"))
    with pytest.raises(ConfigError, match=f"pretrain.from={run} pretrained with pretrain=masked, not pretrain=causal"):
        validate(compose_config(*STAGE_ONE, "pretrain=causal", f"pretrain.from={run}", f"data_dir={data_dir}"))


def test_pretrain_from_refuses_an_encoder_that_is_not_the_one_its_record_names(tmp_path, data_dir, uninterrupted_spt):
    """The source's encoder.pt replaced by another encoder (its SHA-256 is not the record's
    pretrain_encoder_sha256): one line, exit 1, no record pairing that encoder with the source's stage 1."""
    import shutil

    from lra.errors import UserError

    source = tmp_path / "source"
    shutil.copytree(uninterrupted_spt, source)
    encoder = source / "pretrain" / "encoder.pt"
    payload = torch.load(encoder, weights_only=False)
    payload["encoder"] = {name: tensor + 1 for name, tensor in payload["encoder"].items()}  # another run's weights
    torch.save(payload, encoder)
    replaced = encoder.read_bytes()
    refused = run_command(["lra-train", *STAGE_ONE, f"pretrain.from={source}", "hydra.run.dir=new"], tmp_path, data_dir,
                          check=False)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 1 and len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert f"{encoder} is not the encoder that run's record names" in errors[0]
    assert not (tmp_path / "new").exists(), "a refusal before the run claims its folder leaves none (it left it empty)"
    assert encoder.read_bytes() == replaced, "the source is left as it was"
    finished = json.loads((source / "pretrain" / "finished.json").read_text())
    finished["encoder_sha256"] = hashlib.sha256(replaced).hexdigest()  # the stage's record made to name it too
    (source / "pretrain" / "finished.json").write_text(json.dumps(finished))
    with pytest.raises(UserError, match="its metrics.json names another encoder .* than its pretrain/finished.json"):
        validate(compose_config(*STAGE_ONE, f"pretrain.from={source}", f"data_dir={data_dir}"))


def error_lines(result):
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_pretrain_from_refuses_a_source_stopped_while_stage_one_ended_and_reads_one_stopped_after_it(
        tmp_path, data_dir, uninterrupted_spt):
    """A source killed after writing its encoder but before recording the stage's end: refused with one line
    (exit 2, the dry run too, nothing written) that names the resume finishing it. A source killed after
    the stage's own record of its end, whose metrics.json still says pretrain_status running: its stage is
    read as finished, and the fine-tune's record says completed and equals the one-command run."""
    sources = {}
    for fault in ("encoder_written:1", "stage_recorded:1"):
        killed = run_command(["lra-train", *STAGE_ONE, "pretrain=masked", f"hydra.run.dir={fault[:7]}"], tmp_path,
                             data_dir, env_extra={"LRA_FAULT": fault}, check=False)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        sources[fault] = tmp_path / fault[:7]
        assert read_json(sources[fault] / "metrics.json")["pretrain_status"] == "running"
    unfinished = sources["encoder_written:1"]
    command = ["lra-train", *STAGE_ONE, f"pretrain.from={unfinished}", "hydra.run.dir=new"]
    real = run_command(command, tmp_path, data_dir, check=False)
    dry = run_command([*command, "--cfg", "job"], tmp_path, data_dir, check=False)
    (line,) = error_lines(real)
    assert real.returncode == dry.returncode == 2 and error_lines(dry) == [line] and dry.stdout == "", real.stderr
    assert line.startswith(f"error: pretrain.from={unfinished} stopped while its pretraining stage ended") and \
        f"finish that stage with `lra-train resume={unfinished}`" in line, line
    assert not (tmp_path / "new").exists(), "a refused config leaves no folder"
    run_command(["lra-train", *STAGE_ONE, f"pretrain.from={sources['stage_recorded:1']}", "hydra.run.dir=fine-tuned"],
                tmp_path, data_dir)
    record, expected = read_json(tmp_path / "fine-tuned" / "metrics.json"), read_json(uninterrupted_spt / "metrics.json")
    assert (record["status"], record["pretrain_status"]) == ("completed", "completed")
    for key in ("pretrain_steps", "pretrain_history", "pretrain_encoder_sha256", "test_accuracy", "best_val_accuracy"):
        assert record[key] == expected[key], key


def test_stage_one_is_finished_when_its_folder_says_so_whatever_the_status_in_its_record(tmp_path, uninterrupted_spt):
    """finished_stage decides from the folder: the stage's record of its end (pretrain/finished.json) beside
    its encoder; for a run from before that file, a metrics.json naming the encoder's SHA-256 (also one whose
    pretrain_status a killed run left at running); an unreadable finished.json (damaged, a FIFO) is one line."""
    import shutil

    from lra.errors import UserError
    from lra.pretraining import finished_stage

    run = tmp_path / "run"
    shutil.copytree(uninterrupted_spt, run)
    stage = finished_stage(run)
    assert stage.fields["pretrain_status"] == "completed" and stage.encoder == run / "pretrain" / "encoder.pt"
    assert stage.sha256 == hashlib.sha256(stage.encoder.read_bytes()).hexdigest() == stage.fields["pretrain_encoder_sha256"]
    assert stage.fields["pretrain_steps"] == 6 and stage.fields["pretrain_resumed_at_steps"] == []
    record = read_json(run / "metrics.json")
    (run / "metrics.json").write_text(json.dumps(record | {"pretrain_status": "running"}))
    assert finished_stage(run).fields == stage.fields, "the folder decides, not the record's status"
    (run / "pretrain" / "finished.json").unlink()  # a run from before the stage recorded its own end
    assert finished_stage(run).fields["pretrain_status"] == "completed" and finished_stage(run).sha256 == stage.sha256
    (run / "metrics.json").write_text(json.dumps(record | {"pretrain_encoder_sha256": None}))
    assert finished_stage(run) is None, "an encoder that no record names: the stage was stopped while it ended"
    (run / "pretrain" / "finished.json").write_text('{"encoder_sha256": "')
    with pytest.raises(UserError, match=r"finished.json is unreadable \(JSONDecodeError\); .* delete it and resume"):
        finished_stage(run)
    (run / "pretrain" / "finished.json").unlink()
    os.mkfifo(run / "pretrain" / "finished.json")  # read, it would block forever
    with pytest.raises(UserError, match=r"finished.json is unreadable \(ValueError\)"):
        finished_stage(run)


def test_a_resume_refuses_a_damaged_record_of_stage_ones_end_and_its_fix_completes_the_run(
        tmp_path, data_dir, uninterrupted_spt):
    killed = run_command(["lra-train", *STAGE_ONE, "pretrain=masked", "hydra.run.dir=run"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "stage_recorded:1"}, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run, marker = tmp_path / "run", tmp_path / "run" / "pretrain" / "finished.json"
    marker.write_text(marker.read_text()[:40])
    before = (run / "metrics.json").read_bytes()
    refused = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
    (line,) = error_lines(refused)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert line == (f"error: {marker} is unreadable (JSONDecodeError); it records the end of that run's pretraining "
                    f"stage: delete it and resume the run (lra-train resume={run}), which records the stage's end again")
    assert (run / "metrics.json").read_bytes() == before, "a refused resume changes nothing"
    marker.unlink()
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    record, expected = read_json(run / "metrics.json"), read_json(uninterrupted_spt / "metrics.json")
    assert (record["status"], record["pretrain_status"], record["pretrain_resumed_at_steps"]) == ("completed", "completed", [6])
    assert record["test_accuracy"] == expected["test_accuracy"] and marker.is_file()


def test_a_full_disk_when_stage_one_records_its_end_is_one_line_and_the_resume_ends_the_stage_again(
        tmp_path, data_dir, uninterrupted_spt):
    failed = run_command(["lra-train", *STAGE_ONE, "pretrain=masked", "hydra.run.dir=run"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "encoder_written:1:ENOSPC"}, check=False)
    (line,) = error_lines(failed)
    assert failed.returncode == 1 and line.startswith("error: No space left on device") and "Traceback" not in failed.stderr
    run = tmp_path / "run"
    record = read_json(run / "metrics.json")
    assert (record["status"], record["pretrain_status"]) == ("failed", "failed"), "stage 1 did not record its end"
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    record, expected = read_json(run / "metrics.json"), read_json(uninterrupted_spt / "metrics.json")
    assert (record["status"], record["pretrain_status"], record["pretrain_resumed_at_steps"]) == ("completed", "completed", [6])
    assert (record["pretrain_encoder_sha256"], record["test_accuracy"]) == (expected["pretrain_encoder_sha256"],
                                                                            expected["test_accuracy"])


def test_a_fine_tune_killed_between_its_copy_of_the_encoder_and_its_record_copies_it_again(
        tmp_path, data_dir, uninterrupted_spt):
    """pretrain.from: its copy of the source's encoder is not finished until the copy's record of the stage's
    end is written; killed between them, the resume needs the source again (moved away: one line, nothing
    changed), and completes as the uninterrupted fine-tune once it is back."""
    killed = run_command(["lra-train", *STAGE_ONE, f"pretrain.from={uninterrupted_spt}", "hydra.run.dir=run"], tmp_path,
                         data_dir, env_extra={"LRA_FAULT": "encoder_written:1"}, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run = tmp_path / "run"
    assert (run / "pretrain" / "encoder.pt").is_file() and not (run / "pretrain" / "finished.json").exists()
    moved = uninterrupted_spt.parent / "moved"
    uninterrupted_spt.rename(moved)
    try:
        before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file() and path.name != ".lock"}
        refused = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
        (line,) = error_lines(refused)
        assert refused.returncode == 2 and line == (  # it said "pass a run directory", which a resume cannot
            f"error: resume={run} fine-tunes the encoder of pretrain.from={uninterrupted_spt}, and this run's copy of it "
            "was not finished when it stopped, so it needs that run again: it is no longer there; put that run back "
            f"at {uninterrupted_spt}, or start a new run"), refused.stderr
        assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file() and path.name != ".lock"} == before
    finally:
        moved.rename(uninterrupted_spt)
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    record, expected = read_json(run / "metrics.json"), read_json(uninterrupted_spt / "metrics.json")
    assert (record["status"], record["pretrain_status"], record["pretrain_from"]) == ("completed", "completed",
                                                                                      str(uninterrupted_spt))
    assert (record["pretrain_encoder_sha256"], record["test_accuracy"]) == (expected["pretrain_encoder_sha256"],
                                                                            expected["test_accuracy"])


@pytest.mark.parametrize("name", attention_zoo.names())
def test_every_backend_pretrains_and_hands_its_encoder_over(tmp_path, data_dir, name):
    """Stage 1 with each registered backend (its causal mode where it has one): finite losses over two
    steps, and the encoder's weights load into the classifier as they are."""
    from lra.pretrainer import Pretrainer
    from lra.training import Trainer

    objective = "causal" if attention_zoo.get(name).cls.supports_causal else "masked"
    cfg = compose_config(*STAGE_ONE, f"attention={name}", f"pretrain={objective}", "trainer.max_length=128",
                         f"data_dir={data_dir}")
    stage = Pretrainer(cfg, tmp_path / "run", announce=lambda m: None)
    losses = [float(stage.train_step()["loss"]) for _ in range(2)]
    assert all(math.isfinite(loss) and loss > 0 for loss in losses), losses
    fine_tune = Trainer(cfg, tmp_path / "run", announce=lambda m: None)
    fine_tune.start_from_encoder(stage.model.encoder.state_dict())


@pytest.mark.parametrize("objective", ["masked", "causal"])
def test_stage_one_learns_what_context_predicts(objective):
    """Each sequence repeats a random 4-token motif 16 times: a token alone is uniform over 16 ids (ln 16
    nats), in context it is certain, except, causally, the motif's first three tokens after the first
    one (3 of 63 predictions at ln 16 each: a floor of 3/63 · ln 16 = 0.132 nats)."""
    from lra.model import LanguageModel

    cfg = compose_config("attention=softmax", f"pretrain={objective}", "task.max_length=64", "model.dropout=0")
    torch.manual_seed(0)
    model = LanguageModel(cfg.model, cfg.task, attention_spec(cfg), 64, causal=objective == "causal")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    real = torch.ones(32, 64, dtype=torch.bool)
    for step in range(150):
        ids = torch.randint(1, 17, (32, 4), generator=generator).repeat(1, 16)
        if objective == "masked":
            masked = draw_masked(real, 0.5, masking_draws(0, step, range(32), 1, 64))
            loss = token_loss(model(ids, real, masked), ids, masked)[0]
        else:
            loss = token_loss(model(ids, real)[:, :-1], ids[:, 1:], real[:, 1:])[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    floor = 0.0 if objective == "masked" else 3 / 63 * math.log(16)
    assert floor <= float(loss) < floor + 0.05, float(loss)


def test_the_row_label_is_decided_once_and_carries_spt():
    from lra.validation import run_label

    assert run_label(compose_config("attention=yoso")) == "YOSO-32"
    assert run_label(compose_config("attention=yoso", "pretrain=masked")) == "YOSO-32 +SPT"
    assert run_label(compose_config("attention=softmax", "pretrain.from=/some/run")) == "Softmax +SPT"
    # a sweep job refused for its attention options is still recorded under a row
    assert run_label(compose_config("attention=yoso", "attention.num_hashes=0", "pretrain=masked")) == "yoso +SPT"
