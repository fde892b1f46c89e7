"""What the project wrote is checked against its record every time it is read: generated ListOps and
Pathfinder against the generator's checksums (what differs is generated again from the seed, with one
line saying so), a prepared cache against its manifest (an edited manifest, a truncated or swapped
file: refused with the command that rebuilds it, never a traceback, never used)."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from conftest import SMALL_LISTOPS, run_command
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data import listops
from lra.data.cache import MANIFEST, MANIFEST_DIGEST, manifest_digest
from lra.data.prepare import load_task_data
from lra.errors import UserError

register_configs()
register_resolvers()
LISTOPS = [o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]
PATHFINDER = ["task=pathfinder", "task.source=generate", "task.generator.num_images=30",
              "task.generator.images_per_folder=10", "task.generator.workers=1"]


def task_config(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides)).task


def prepare(data, *overrides, prepare=True):
    """(the prepared data, the lines it announced)."""
    lines = []
    return load_task_data(task_config(*overrides), data, announce=lines.append, prepare=prepare), lines


def digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- generated ListOps
def remove_rows(path, count=5):
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-count]))


def change_a_label(path):
    lines = path.read_text().splitlines(keepends=True)
    source, label = lines[1].rstrip("\n").split("\t")
    lines[1] = f"{source}\t{(int(label) + 1) % 10}\n"
    path.write_text("".join(lines))


def record_other_settings(folder):
    record = json.loads((folder / listops.GENERATED).read_text())
    record["settings"]["seed"] = 7
    (folder / listops.GENERATED).write_text(json.dumps(record))


EDITS = {  # what a user (or a disk) may do to generated ListOps, and what the one line says
    "rows removed": (lambda f: remove_rows(f / "basic_train.tsv"), "basic_train.tsv changed since it was generated "
                                                                   "(91 rows on disk, 96 generated)"),
    "a validation label changed": (lambda f: change_a_label(f / "basic_val.tsv"), "basic_val.tsv changed"),
    "a file deleted": (lambda f: (f / "basic_test.tsv").unlink(), "lacks basic_test.tsv"),
    "its record deleted": (lambda f: (f / listops.GENERATED).unlink(), f"has no {listops.GENERATED}"),
    "its record of an older version": (lambda f: (f / listops.GENERATED).write_text('{"seed": 0}'), "unreadable"),
    "its record's settings edited": (record_other_settings, "records other settings"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_generated_listops_that_differs_from_its_record_is_generated_again_before_it_is_converted(tmp_path, edit):
    first, _ = prepare(tmp_path / "data", *LISTOPS)
    (generated,) = (tmp_path / "data" / "listops" / "generated").iterdir()
    files = digest(generated)
    damage, said = EDITS[edit]
    damage(generated)
    shutil.rmtree(first.cache_dir)  # the next read of the generated files is a conversion
    again, lines = prepare(tmp_path / "data", *LISTOPS)
    (line,) = [line for line in lines if "generated ListOps" in line]
    assert said in line and line.endswith("generating it again from seed 0"), line
    assert digest(generated) == files, "the seed made the same files again"
    assert again.fingerprint == first.fingerprint and again.manifest["counts"] == {"train": 96, "val": 24, "test": 24}


def test_edited_generated_listops_is_never_trained_on_end_to_end(tmp_path, data_dir):
    """Rows removed and a validation label changed, then lra-train: one line says
    the data is generated again, and the run trains on exactly the data of an untouched run."""
    data = tmp_path / "data"
    args = ["lra-train", "trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2", "model.num_layers=1",
            *SMALL_LISTOPS, f"data_dir={data}"]
    run_command([*args, "hydra.run.dir=clean"], tmp_path, data_dir)
    (generated,) = (data / "listops" / "generated").iterdir()
    remove_rows(generated / "basic_train.tsv")
    change_a_label(generated / "basic_val.tsv")
    shutil.rmtree(data / "listops" / "cache")
    result = run_command([*args, "hydra.run.dir=edited"], tmp_path, data_dir)
    assert "changed since it was generated" in result.stdout + result.stderr
    clean, edited = (json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("clean", "edited"))
    for key in ("data_fingerprint", "best_val_accuracy", "test_accuracy"):
        assert edited[key] == clean[key], key


# ----------------------------------------------------------------------------- generated Pathfinder
def replace_an_image(root):
    image = root / "imgs" / "1" / "sample_13.png"
    Image.fromarray(np.full((32, 32), 255, dtype=np.uint8)).save(image)
    return "imgs/1/sample_13.png changed"


def truncate_an_image(root):
    image = root / "imgs" / "0" / "sample_2.png"
    image.write_bytes(image.read_bytes()[:40])
    return "imgs/0/sample_2.png changed"


def edit_a_label(root):
    metadata = root / "metadata" / "2.npy"
    lines = metadata.read_text().splitlines()
    fields = lines[0].split()
    fields[3] = "1" if fields[3] == "0" else "0"
    metadata.write_text("\n".join([" ".join(fields), *lines[1:]]) + "\n")
    return "metadata/2.npy changed (folder 2)"


def add_a_metadata_file(root):
    shutil.copy(root / "metadata" / "0.npy", root / "metadata" / "7.npy")
    return "metadata/7.npy is not one of its folders"


def delete_a_checksum_record(root):
    (root / "checksums" / "1.json").unlink()
    return "checksums/1.json is missing (folder 1)"


@pytest.mark.parametrize("damage", [replace_an_image, truncate_an_image, edit_a_label, add_a_metadata_file,
                                    delete_a_checksum_record])
def test_generated_pathfinder_that_differs_from_its_checksums_is_drawn_again(tmp_path, damage):
    first, _ = prepare(tmp_path / "data", *PATHFINDER)
    (root,) = (tmp_path / "data" / "pathfinder" / "generated").glob("*/pathfinder32/*")
    files = digest(root)
    said = damage(root)
    shutil.rmtree(first.cache_dir)
    again, lines = prepare(tmp_path / "data", *PATHFINDER)
    (line,) = [line for line in lines if "generated Pathfinder" in line]
    assert said in line and line.endswith("drawing it again from seed 0"), line
    assert digest(root) == files, "the seed drew the same files again"
    assert again.fingerprint == first.fingerprint


# ----------------------------------------------------------------------------- the prepared cache
def edit_manifest(cache, change, keep_digest=False):
    manifest = json.loads((cache / MANIFEST).read_text())
    change(manifest)
    if keep_digest:  # an edit that also recomputes the manifest's digest: the consistency checks remain
        manifest[MANIFEST_DIGEST] = manifest_digest(manifest)
    (cache / MANIFEST).write_text(json.dumps(manifest))


def swap_label_files(cache):
    """Two files of the same size exchanged on disk (the manifest untouched)."""
    (cache / "val.labels.npy").rename(cache / "tmp")
    (cache / "test.labels.npy").rename(cache / "val.labels.npy")
    (cache / "tmp").rename(cache / "test.labels.npy")


def leave_out_validation(manifest):
    for key in ("counts", "num_documents"):
        manifest[key].pop("val")
    for name in ("labels", "offsets0", "tokens0"):
        manifest["files"].pop(f"val.{name}.npy")


MANIFEST_EDITS = {  # edit → what the damaged-cache line names
    "a count": (lambda c: edit_manifest(c, lambda m: m["counts"].update(train=95)), "changed after the cache was built"),
    "a count, digest recomputed": (lambda c: edit_manifest(c, lambda m: m["counts"].update(train=95), True),
                                   "the train split has 96 labels but its count is 95"),
    "documents per example": (lambda c: edit_manifest(c, lambda m: m["num_documents"].update(train=2), True),
                              "lists other files than its splits have"),
    "a file left out": (lambda c: edit_manifest(c, lambda m: m["files"].pop("val.tokens0.npy"), True),
                        "does not match its fingerprint"),
    "a split left out": (lambda c: edit_manifest(c, leave_out_validation, True), "does not match its fingerprint"),
    "an alias over a stored split": (lambda c: edit_manifest(c, lambda m: m.update(aliases={"val": "train"}), True),
                                     "aliases"),
    "the settings": (lambda c: edit_manifest(c, lambda m: m["settings"].update(source="lra_release"), True),
                     "does not match its fingerprint"),
    "its digest removed": (lambda c: edit_manifest(c, lambda m: (m.pop(MANIFEST_DIGEST),
                                                                 m.update(aliases={"val": "train"}))),
                           "has no manifest_sha256"),
    "the format version": (lambda c: edit_manifest(c, lambda m: m.update(format_version=2), True), "format version 2"),
    "not an object": (lambda c: (c / MANIFEST).write_text("[1, 2]"), "lacks its files"),
    "two files swapped": (swap_label_files, "labels.npy does not match its checksum"),
    "a file truncated": (lambda c: (c / "train.labels.npy").write_bytes((c / "train.labels.npy").read_bytes()[:-8]),
                         "train.labels.npy does not match its checksum"),
    "a file deleted": (lambda c: (c / "test.offsets0.npy").unlink(), "test.offsets0.npy is missing"),
}


@pytest.mark.parametrize("edit", MANIFEST_EDITS)
def test_a_cache_that_differs_from_its_manifest_is_refused_with_its_rebuild_command(tmp_path, edit):
    data, _ = prepare(tmp_path / "data", *LISTOPS)
    damage, said = MANIFEST_EDITS[edit]
    damage(data.cache_dir)
    files = digest(data.cache_dir)
    with pytest.raises(UserError) as refused:
        prepare(tmp_path / "data", *LISTOPS, prepare=False)
    message = str(refused.value)
    assert f"the data cache {data.cache_dir} is damaged" in message and said in message, message
    assert message.endswith(f"rebuild it with: rm -r {data.cache_dir} and run the same command again")
    assert digest(data.cache_dir) == files, "a refused cache is left as it was"


def test_an_edited_manifest_ends_lra_train_with_one_line_and_the_printed_rebuild_command_works(tmp_path, data_dir):
    """End to end: a manifest whose split lost its documents' files (FileNotFoundError
    before) stops lra-train with the damaged-cache line; running the command it prints rebuilds the cache."""
    data = tmp_path / "data"
    args = ["lra-prepare", "listops", "--data-dir", str(data), *LISTOPS]
    run_command(args, tmp_path, data_dir)
    (cache,) = (data / "listops" / "cache").iterdir()
    edit_manifest(cache, lambda m: m["num_documents"].update(val=3))
    train = ["lra-train", "trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2", "model.num_layers=1",
             "task.source=generate", *SMALL_LISTOPS, f"data_dir={data}", "trainer.train_subset=null",
             "trainer.eval_subset=null", f"hydra.run.dir={tmp_path / 'run'}"]
    refused = run_command(train, tmp_path, data_dir, check=False)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 1 and len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "is damaged (manifest.json was changed after the cache was built" in errors[0]
    assert errors[0].endswith(f"rebuild it with: rm -r {cache} and run the same command again")
    assert shlex.split(errors[0].split("rebuild it with: ")[1])[:3] == ["rm", "-r", str(cache)]
    shutil.rmtree(cache)  # what the line says to do, then the same command
    run_command(train, tmp_path, data_dir)


# ----------------------------------------------------------------------------- a run's own config and encoder
KILLED = ["lra-train", "trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "trainer.checkpoint_every=2",
          "model.num_layers=1", *SMALL_LISTOPS]


def run_files(run):
    return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and p.name not in (".lock", "train.log")}


def refused_resume(run, root, data_dir, words):
    """``lra-train resume=run``: one line holding ``words``, exit 1, and not a byte of the run changed."""
    before = run_files(run)
    result = run_command(["lra-train", f"resume={run}"], root, data_dir, check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1 and words in errors[0], result.stderr
    assert "Traceback" not in result.stderr and run_files(run) == before
    return errors[0]


def test_a_resume_whose_saved_config_was_edited_is_refused_until_it_is_put_back(tmp_path, data_dir):
    """An edited .hydra/resolved.yaml (a learning rate, more steps) was trained on silently: another run
    under this run's record. The checkpoint carries the config's SHA-256."""
    run = tmp_path / "run"
    killed = run_command([*KILLED, f"hydra.run.dir={run}"], tmp_path, data_dir, env_extra={"LRA_FAULT": "step:3"},
                         check=False)
    assert killed.returncode == -9 and (run / "checkpoints" / "last.pt").is_file()
    saved = (run / ".hydra" / "resolved.yaml").read_text()
    (run / ".hydra" / "resolved.yaml").write_text(saved.replace("  lr: 0.0001\n", "  lr: 0.5\n"))
    line = refused_resume(run, tmp_path, data_dir, "it is not this run's checkpoint, or the run's config was edited "
                                                   "since (the checkpoint was trained with a .hydra/resolved.yaml of")
    assert "put the run's own files back, or start a new run with the settings you want" in line
    (run / ".hydra" / "resolved.yaml").write_text(saved.replace("  lr: 0.0001\n", "  lr: -1.0\n"))
    before = run_files(run)
    for flags in ([], ["--cfg", "job"]):  # a value validation refuses: no override can fix a resume's config
        result = run_command(["lra-train", f"resume={run}", *flags], tmp_path, data_dir, check=False)
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 2 and line.startswith(
            f"error: cannot resume {run}: the config it saved is refused (invalid value for trainer.lr: -1.0"), line
        assert line.endswith(f"and a resume takes no overrides: restore {run / '.hydra' / 'resolved.yaml'} as the run "
                             "wrote it, or start a new run with a valid value") and run_files(run) == before, line
    (run / ".hydra" / "resolved.yaml").write_text(saved)
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert json.loads((run / "metrics.json").read_text())["status"] == "completed"


def test_a_resume_whose_own_encoder_was_replaced_is_refused(tmp_path, data_dir):
    """A run killed in stage 2 before its first checkpoint fine-tuned whatever pretrain/encoder.pt held on
    resume, under a record naming the original encoder's SHA-256; it is checked as pretrain.from's is."""
    import torch

    run = tmp_path / "run"
    killed = run_command([*KILLED, "pretrain=masked", "pretrain.max_steps=2", f"hydra.run.dir={run}"], tmp_path,
                         data_dir, env_extra={"LRA_FAULT": "step:3"}, check=False)  # stage 2's first step
    encoder = run / "pretrain" / "encoder.pt"
    assert killed.returncode == -9 and encoder.is_file() and not (run / "checkpoints").exists()
    original = encoder.read_bytes()
    payload = torch.load(encoder, weights_only=False)
    first = next(iter(payload["encoder"]))
    payload["encoder"][first] = payload["encoder"][first] + 1  # another encoder of the same shape
    torch.save(payload, encoder)
    line = refused_resume(run, tmp_path, data_dir, f"resume={run}: {encoder} is not the encoder that run's record names")
    assert line.endswith("put this run's encoder back, or start a new run (stage 2 would otherwise fine-tune another "
                         "encoder than its record names)")
    encoder.write_bytes(original)
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    record = json.loads((run / "metrics.json").read_text())
    assert record["status"] == "completed" and record["pretrain_encoder_sha256"] == hashlib.sha256(original).hexdigest()


def test_lra_fidelity_refuses_a_best_checkpoint_that_another_run_trained(tmp_path, data_dir):
    """Another run's best.pt of the same shapes (seed 1's in seed 0's folder) was measured as this run's."""
    for seed in (0, 1):
        run_command([*KILLED, f"seed={seed}", f"hydra.run.dir=run{seed}"], tmp_path, data_dir)
    best = tmp_path / "run0" / "checkpoints" / "best.pt"
    best.write_bytes((tmp_path / "run1" / "checkpoints" / "best.pt").read_bytes())
    result = run_command(["lra-fidelity", "preset=smoke", "sections=[backends]", f"checkpoint={tmp_path / 'run0'}",
                          "output_dir=out"], tmp_path, data_dir, check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert errors[0].startswith(f"error: cannot measure the weights in {best}: it is not this run's checkpoint")
    assert errors[0].endswith("put the run's own files back, or pass another run as checkpoint=")
    assert not (tmp_path / "out").exists()
