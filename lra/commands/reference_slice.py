"""``lra-gpu-check --reference``: a slice of the YOSO Table 3 ListOps runs, checked before anything runs
as ``lra-train`` checks a config, and its records packed with the config each run trained.

Every job of the slice (each row x seed x any sweep in the overrides, expanded as Hydra's sweeper does)
is composed and validated with lra-train's own rules, so a mistake is refused with lra-train's own
``error:`` line and exit 2 before the sweep starts, in ``--plan`` too. A ``--sweep-dir`` is checked as an
output folder, and a folder that holds another slice (other rows, seeds or overrides: Hydra's
``multirun.yaml`` there keeps the command's overrides) is refused with the command that continues it.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional

from lra.errors import ConfigError, UserError
from lra.packing import pack_size
from lra.io import check_output_folder, check_outside
from lra.records import REPO_ROOT, read_record
from lra.run import PACKED, hydra_value

TABLE3_ROWS = REPO_ROOT / "conf" / "row" / "yoso_table3"  # the rows of `experiment=yoso_table3`
SETUP = ["experiment=yoso_table3", "task=listops"]
# Overrides of what the command sets itself (a hydra.* key: anything under it), and how to set that instead.
OWNED = {
    "row": "use --rows", "seed": "use --seeds", "trainer.device": "use --device", "hydra.sweep": "use --sweep-dir",
    "hydra/launcher": "use --runs-per-process or --jobs-per-gpu",
    "hydra.launcher": "use --runs-per-process or --jobs-per-gpu",
    "hydra/sweeper": "a slice's jobs are --rows x --seeds x the sweeps in its overrides (e.g. trainer.lr=0.1,0.2)",
    "hydra.sweeper": "a slice's jobs are --rows x --seeds x the sweeps in its overrides (e.g. trainer.lr=0.1,0.2)",
    "experiment": "a slice is always experiment=yoso_table3 (another preset: lra-train -m experiment=<it>)",
    "task": "a slice is always task=listops (another task: lra-train -m experiment=yoso_table3 task=<it>)",
    "resume": "the same command with the same --sweep-dir continues a slice, each unfinished run resumed",
}


def table3_rows() -> List[str]:
    return sorted(path.stem for path in TABLE3_ROWS.glob("*.yaml"))


def listed(option: str, value: Optional[str], default: List[str], check: Callable[[str], Optional[str]],
           fail: Callable[[str], None],
           twice: str = "each would be trained again into a folder of its own: list each once") -> List[str]:
    """The comma-separated ``value`` of ``option`` as a list (``default`` when not given): an empty
    value (an unset shell variable), an empty item, an item ``check`` refuses or a repeated one (``twice``:
    what repeating it would do) is ``fail(line)``."""
    if value is None:
        return default
    items = [item.strip() for item in value.split(",")]
    if not value.strip():
        fail(f"{option} {value!r} is empty (an unset shell variable?); name at least one, or leave {option} out "
             f"(default: {','.join(default)})")
    if "" in items:
        fail(f"{option} {value!r} has an empty item; separate the items with single commas")
    for item in items:
        why = check(item)
        if why:
            fail(f"{option} {item}: {why}")
    repeated = sorted({item for item in items if items.count(item) > 1})
    if repeated:
        fail(f"{option} lists {', '.join(repeated)} more than once; {twice}")
    return items


@dataclass
class Slice:
    rows: List[str]
    seeds: List[str]
    overrides: List[str]
    device: str
    jobs_per_gpu: Optional[int] = None  # processes on the GPU at once (hydra/launcher=local_gpus); None: packed
    runs_per_process: str = "auto"  # runs packed in the one process (hydra/launcher=packed): a number, or auto

    def task_overrides(self) -> List[str]:
        """lra-train's overrides of every job (what Hydra keeps as the sweep's ``overrides.task``)."""
        return [*SETUP, f"row={','.join('yoso_table3/' + row for row in self.rows)}", f"seed={','.join(self.seeds)}",
                f"trainer.device={self.device}", "logger=none", *self.overrides]

    def workers_per_gpu(self) -> int:
        """``jobs_per_gpu``, at most the slice's number of jobs: the launcher starts every worker it may use
        at once (--jobs-per-gpu 100000 would start as many processes for a slice of two runs)."""
        return min(self.jobs_per_gpu, len(self.jobs()))

    def launcher(self) -> List[str]:
        """The launcher's overrides: the runs packed in one process (lra.packing), or ``jobs_per_gpu`` processes."""
        if self.jobs_per_gpu is None:
            return ["hydra/launcher=packed", f"hydra.launcher.runs_per_process={self.runs_per_process}"]
        return ["hydra/launcher=local_gpus", f"hydra.launcher.jobs_per_gpu={self.workers_per_gpu()}"]

    def launcher_options(self) -> List[str]:
        """The lra-gpu-check options that choose :meth:`launcher`."""
        if self.jobs_per_gpu is None:
            return ["--runs-per-process", self.runs_per_process]
        return ["--jobs-per-gpu", str(self.jobs_per_gpu)]

    def sharing(self) -> str:
        """How the runs share the GPU, in words (the plan's)."""
        if self.jobs_per_gpu is None:
            at_once = "as many at a time as the GPU holds" if self.runs_per_process == "auto" else \
                f"{pack_size(int(self.runs_per_process), len(self.jobs()))} at a time"
            return f"packed in one process, {at_once}"
        return f"{self.workers_per_gpu()} jobs per GPU"

    def command(self, sweep_dir: Path) -> List[str]:
        """The lra-train arguments after ``-m``."""
        return [*self.launcher(), *self.task_overrides(), f"hydra.sweep.dir={hydra_value(sweep_dir)}"]

    def jobs(self) -> List[List[str]]:
        """Each job's overrides, the sweep expanded as Hydra's basic sweeper expands it."""
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from hydra.errors import HydraException

        parsed = OverridesParser.create().parse_overrides(self.task_overrides())
        try:
            return BasicSweeper.split_arguments(parsed, max_batch_size=None)[0]
        except HydraException as exc:  # interval(): a range of real numbers, no list of jobs
            raise ConfigError(f"{str(exc).splitlines()[0]}; a slice sweeps lists of values: a,b,c, range(...) or "
                              "choice(...) (e.g. trainer.lr=0.001,0.002)") from None

    def check(self, assume_cuda: bool = False) -> int:
        """Refuse the first mistake in the overrides or in any job's composed config, with lra-train's line
        (:class:`ConfigError`, exit 2); the number of jobs. ``assume_cuda``: check as on a machine with a
        GPU (``--plan`` of a CUDA slice printed where there is none)."""
        check_overrides(self.overrides)
        jobs = self.jobs()
        with _cuda_assumed(assume_cuda):
            for job in jobs:
                check_job(job)
        return len(jobs)


def check_overrides(overrides: List[str]) -> None:
    """Each override parses as Hydra parses it, and sets nothing the command's own options set."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        if not override.strip():
            raise ConfigError(f"an override is empty ({override!r}: an unset shell variable?); leave it out, or give "
                              "key=value")
        key = _explained(lambda: parser.parse_overrides([override])[0].key_or_group, [override])
        fix = next((OWNED[name] for name in OWNED if key == name or (name.startswith("hydra.") and
                                                                     key.startswith(name + "."))), None)
        if fix is not None:
            raise ConfigError(f"the override {override!r} sets what lra-gpu-check --reference sets itself: {fix}")


def check_job(job: List[str]) -> None:
    """Compose ``job`` and validate it as ``lra-train --cfg job`` does (the same line, exit 2)."""
    from lra.validation import validate

    _explained(lambda: validate(_compose(job)), job)


def _compose(overrides: List[str], hydra_node: bool = False):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lra.config import CONF_DIR, register_configs, register_resolvers

    register_configs()
    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=overrides, return_hydra_config=hydra_node)
    finally:
        GlobalHydra.instance().clear()


def _explained(action: Callable, job: List[str]):
    """``action()``, a Hydra or OmegaConf error turned into lra-train's line for it (ConfigError)."""
    from lra.commands.composition_errors import explain

    try:
        return action()
    except UserError:
        raise
    except Exception as exc:
        line = explain(exc, _valid_keys(job))
        if line is None:
            raise
        raise ConfigError(line) from None


def _valid_keys(job: List[str]) -> Callable[[str], list]:
    """The keys at a dotted path of ``job``'s config, its group choices applied (the suggestions of an
    unknown key's line, as lra-train lists them from its command line's choices)."""
    from omegaconf import DictConfig, OmegaConf

    from lra.config import CONF_DIR

    groups = {path.name for path in CONF_DIR.iterdir() if path.is_dir()}
    choices = [o for o in job if "=" in o and o.split("=")[0] in groups]

    def valid_keys(path: str) -> list:
        try:
            node = _compose(choices, hydra_node=path.split(".")[0] == "hydra")
        except Exception:
            return []
        node = OmegaConf.select(node, path) if path else node
        return sorted(node.keys()) if isinstance(node, DictConfig) else []

    return valid_keys


@contextlib.contextmanager
def _cuda_assumed(assume: bool) -> Iterator[None]:
    """Validation's CUDA checks answered as on a machine with a GPU, while ``assume``."""
    if not assume:
        yield
        return
    import torch

    available = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        yield
    finally:
        torch.cuda.is_available = available


def check_sweep_dir(sweep_dir: Path, planned: Slice, out: Optional[Path]) -> None:
    """``--sweep-dir`` can take this slice: a folder that can be written (one line otherwise, as for any
    output folder), apart from ``--out``, and empty or holding this very slice."""
    from lra.commands.command_line import data_dir, task_data_folders

    lra_train = planned.command(sweep_dir)  # the folder is lra-train's hydra.sweep.dir, checked as lra-train would
    check_output_folder(sweep_dir, "--sweep-dir", reads=[data_dir(lra_train)])
    check_outside(sweep_dir.resolve(), "--sweep-dir", task_data_folders(lra_train), reader="lra-train")
    if out is not None:
        out, sweep = Path(out).resolve(), sweep_dir.resolve()
        if out == sweep or sweep in out.parents or out in sweep.parents:
            raise UserError(f"--out {out} and --sweep-dir {sweep} lie one inside the other (lra-table would count the "
                            "packed records as runs of the slice): give them separate folders")
    if not sweep_dir.is_dir() or not any(sweep_dir.iterdir()):
        return
    saved = saved_task_overrides(sweep_dir)
    if saved == planned.task_overrides():
        return
    again = continuing_command(saved, sweep_dir, planned.launcher_options())
    held = (f"another slice, made by: {again}" if again else
            f"a sweep lra-gpu-check did not make (lra-train -m {shlex.join(saved)})" if saved is not None else
            "files but no sweep (no multirun.yaml)")
    fix = "continue it with that command, or give --sweep-dir a new folder" if again else \
        "give --sweep-dir a new or empty folder"
    raise ConfigError(f"--sweep-dir {sweep_dir} holds {held}; {fix}")


def saved_task_overrides(sweep_dir: Path) -> Optional[List[str]]:
    """The overrides of the sweep in ``sweep_dir`` (Hydra's multirun.yaml), None where it has none."""
    from lra.run import sweep_overrides

    try:
        return sweep_overrides(sweep_dir)
    except ValueError as exc:
        raise UserError(f"--sweep-dir {sweep_dir}: its multirun.yaml is unreadable ({exc}); give --sweep-dir a new "
                        "folder, or restore that file from the slice's own copy") from None


def continuing_command(saved: Optional[List[str]], sweep_dir: Path, launcher_options: List[str]) -> Optional[str]:
    """The lra-gpu-check command that made the sweep whose overrides are ``saved``, None for another sweep."""
    if not saved or saved[:2] != SETUP or len(saved) < 6 or saved[5] != "logger=none":
        return None
    fields = dict(override.split("=", 1) for override in saved[2:5] if "=" in override)
    if sorted(fields) != ["row", "seed", "trainer.device"] or not all(
            row.startswith("yoso_table3/") for row in fields["row"].split(",")):
        return None
    rows = ",".join(row.split("/", 1)[1] for row in fields["row"].split(","))
    command = ["lra-gpu-check", "--reference", "--device", fields["trainer.device"], "--rows", rows, "--seeds",
               fields["seed"], *launcher_options, "--sweep-dir", str(sweep_dir)]
    return shlex.join([*command, *(["--", *saved[6:]] if saved[6:] else [])])


def pack_records(sweep: Path, target: Path) -> int:
    """Every run's record under ``sweep`` into the gzipped tar ``target`` beside the config it trained and
    its overrides (``yoso-32-seed0/metrics.json``, ``resolved.yaml``, ``overrides.yaml``: :data:`lra.run.PACKED`),
    each in a folder named by its label and seed (the job's folder where the record is unreadable, or where
    two runs share a label and seed), so that the slices of several machines unpack side by side; the number
    of runs packed."""
    from lra.io import atomic_write

    runs = sorted(record.parent for record in sweep.rglob("metrics.json"))
    names = [_record_name(run, sweep) for run in runs]

    def write(handle) -> None:  # whole, then renamed over the last archive: a kill meanwhile leaves that one
        with tarfile.open(fileobj=handle, mode="w:gz") as archive:
            for run, name in zip(runs, names):
                if names.count(name) > 1:
                    name = f"{name}-job-{_slug(str(run.relative_to(sweep)))}"
                for source, packed in PACKED.items():
                    if (run / source).is_file():
                        archive.add(run / source, arcname=f"{name}/{packed}")

    atomic_write(target, write, mode="wb")
    return len(runs)


def _record_name(run: Path, sweep: Path) -> str:
    fields = read_record(run)
    if isinstance(fields.get("label"), str):
        return _slug(f"{fields['label']}-seed{fields.get('seed')}")
    return f"job-{_slug(str(run.relative_to(sweep)))}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
