"""The generated data a cache is built from (ListOps' TSV files, Pathfinder's images): checked against the
generator's own record before it is read, generated when absent and generated again from the seed where
it differs, each with one line saying so. Never refused: the seed makes the same files again."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from lra.data import listops, locking, pathfinder_writer
from lra.io import atomic_write_json, check_output_folder


def writable(folder: Path) -> None:
    """The folder under data_dir about to be written (a cache's or generated data's): one line when it
    cannot be (a file in the way, a read-only disk); data_dir is the setting that chose it."""
    check_output_folder(folder, "the data directory (data_dir)",
                        fix="set data_dir=<a writable folder> (or LRA_DATA_DIR; lra-prepare's --data-dir)")


def listops_files(settings, raw_dir: Path, announce) -> None:
    """Generated ListOps in ``raw_dir`` exactly as the generator wrote it (checked against its record,
    :func:`lra.data.listops.generated_problem`): generated when absent, generated again from the seed
    when anything differs (an edited label, a removed row), with one line saying so. Its folder belongs
    to one cache alone, whose preparation lock (:mod:`lra.data.locking`) the caller holds."""
    problem = listops.generated_problem(settings, raw_dir)
    if problem is None:
        return
    total = settings.num_train + settings.num_val + settings.num_test
    if problem == listops.NOT_GENERATED:
        announce(f"ListOps data not found: generating {total:,} examples (seed {settings.seed}) into {raw_dir}")
    else:
        announce(f"the generated ListOps in {raw_dir} {problem}: generating it again from seed {settings.seed}")
    writable(raw_dir)
    with tqdm(total=total, desc="generating ListOps", unit="ex", disable=None) as bar:
        listops.write_generated(settings, raw_dir, progress=bar)


def pathfinder_images(geometry, settings, identity: dict, root: Path, announce) -> None:
    """Generated Pathfinder images in ``root``, checked against their checksum records before they are
    read: generated when absent (an interrupted generation resumes), drawn again from the seed where
    anything differs (:func:`lra.data.pathfinder_writer.repair_release`), with one line saying so. The
    caches of several split seeds read one generated folder: one job at a time generates or repairs it."""
    complete = (root / "complete.json").is_file()
    if not complete:
        writable(root)
    with locking.preparing(root, f"the generated Pathfinder folder {root}", announce, required=not complete):
        if not (root / "complete.json").is_file():  # (the job waited for has made it meanwhile)
            announce(f"Pathfinder data not found: generating {settings.num_images:,} images (seed {settings.seed}) "
                     f"into {root}")
            with tqdm(total=settings.num_images, desc="generating Pathfinder", unit="img", disable=None) as bar:
                pathfinder_writer.write_release(geometry, settings, root, progress=bar.update)
            atomic_write_json(root / "complete.json", identity)
        pathfinder_writer.repair_release(geometry, settings, root, announce)
