"""``lra-profile``: compose the profile config, measure every (backend, length) cell in its own
process, write the report. Nothing else."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from lra.commands import config_errors
from lra.commands.composition_errors import schema_keys
from lra.config import PROFILE_CONF_DIR, register_configs, register_resolvers
from lra.io import atomic_write_text, check_folders_given, check_hydra_output_overrides, check_output_folder
from lra.profiling import measure

log = logging.getLogger("lra.profile")
register_configs()
register_resolvers()


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def run_cells(spec: dict, lengths, timeout_s: int) -> list:
    """One backend at ``lengths`` in a fresh process (one JSON row per length;
    :func:`lra.profiling.measure.run_cell`). A crash, an out-of-memory kill or a timeout becomes a
    recorded row for every length it left unmeasured."""
    rows = measure.run_cell("lra.profiling.cell", [json.dumps(spec | {"lengths": list(lengths)})],
                            timeout_s * len(lengths))
    measured = [row for row in rows if "n" in row]
    reason = next((row["error"] for row in rows if "n" not in row), None)
    done = {row["n"] for row in measured}
    return measured + [{"backend": spec["backend"], "n": n, "batch": spec["batch"], "error": reason or "no result"}
                       for n in lengths if n not in done]


def run_cell(spec: dict, timeout_s: int) -> dict:
    """One (backend, length, batch) cell in its own process."""
    return run_cells(spec, [spec["n"]], timeout_s)[0]


def largest_batch(spec: dict, cfg) -> dict:
    """Double the batch until the cell fails or its training peak exceeds the budget; keep the last fit.
    When batch 1 is over the budget the cell has no batch, and its error says so."""
    budget = cfg.memory_budget_mb
    if budget is None:
        import torch

        budget = (torch.cuda.get_device_properties(spec["device"]).total_memory / 2**20
                  if spec["device"].startswith("cuda") else 8192.0)
    best, batch = None, 1
    while batch <= cfg.max_batch:
        row = run_cell(spec | {"batch": batch}, cfg.timeout_s)
        if row.get("error"):
            return best or row
        if row["training_peak_mb"] * batch > budget:
            break
        best, batch = row, batch * 2
    if best is not None:
        return best
    return {"backend": spec["backend"], "n": spec["n"], "batch": None,
            "error": f"no batch fits the memory budget: batch 1's training peak is {row['training_peak_mb']:.4g} MB, "
                     f"over memory_budget_mb={budget:g}; raise memory_budget_mb"}


OUTPUTS = ("profile.csv", "profile.json", "exponents.csv", "profile.md", "profile.png", "profile_config.yaml")


def start_folder(out_dir: Path) -> list:
    """Remove the outputs a previous run left in ``out_dir`` (:data:`OUTPUTS`), so that what the folder
    holds is this run's alone, however far it gets; the names removed."""
    removed = []
    for name in OUTPUTS:
        if (out_dir / name).is_file() or (out_dir / name).is_symlink():
            (out_dir / name).unlink()
            removed.append(name)
    return removed


def tool_output_dir(cfg, reads=()) -> Path:
    """A tool's ``output_dir``, checked before anything is measured (:func:`lra.io.check_output_folder`);
    refused, it leaves no folder: the one Hydra made for this job (its .hydra/ alone) goes too."""
    from hydra.core.hydra_config import HydraConfig

    from lra.errors import UserError

    try:
        return check_output_folder(cfg.output_dir, "output_dir", reads=reads)
    except UserError:
        hydra_cfg = HydraConfig.get()
        config_errors.remove_hydra_leftovers(hydra_cfg.runtime.output_dir, hydra_cfg.job.name)
        raise


@hydra.main(version_base="1.3", config_path=str(PROFILE_CONF_DIR), config_name="lra_profile")
@config_errors.one_line_user_errors
def run(cfg: DictConfig) -> None:
    import attention_zoo
    from lra.errors import UserError
    from lra.profiling import report
    from lra.validation import validate_tool

    validate_tool(cfg)
    out_dir = tool_output_dir(cfg)
    removed = start_folder(out_dir)
    if removed:
        log.info(f"removed the previous run's {', '.join(removed)} from {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "profile_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    device = _device(cfg.device)
    rows = []
    for backend in cfg.backends:
        spec = {"backend": backend, "batch": cfg.batch_size, "device": device, "num_heads": cfg.num_heads,
                "head_dim": cfg.head_dim, "repeats": cfg.repeats}
        if cfg.sparse_pattern_impl is not None and attention_zoo.get(backend).cls.has_flex_path:
            spec["options"] = {"impl": cfg.sparse_pattern_impl}
        lengths = [int(n) for n in cfg.lengths]
        if cfg.mode == "largest":
            found = [largest_batch(spec | {"n": n}, cfg) for n in lengths]
        else:  # one process per backend: the lengths in ascending order
            found = run_cells(spec, lengths, cfg.timeout_s)
        for row in found:
            log.info(json.dumps(row))
        rows += found  # the rows so far: a profile cut short keeps them, beside its config
        atomic_write_text(out_dir / "profile.csv", pd.DataFrame(rows).to_csv(index=False))
    title = (f"attention modules on {device}{' (wall-clock times on a CPU)' if device == 'cpu' else ''}: "
             f"{cfg.num_heads} heads of {cfg.head_dim}, "
             f"{'largest batch that fits' if cfg.mode == 'largest' else f'batch {cfg.batch_size}'}")
    frame = report.write(rows, out_dir, cfg.fit_min_length, title)
    print((out_dir / "profile.md").read_text())
    shaky = report.unsteady(frame)
    if len(shaky):
        log.warning(f"{len(shaky)} of {len(frame)} cells timed unsteadily (slowest call over {measure.UNSTEADY:g}× "
                    "the fastest: the machine was busy); their times and the exponents fitted over them are not to be "
                    f"trusted: {', '.join(f'{label} at n = {n}' for label, n in zip(shaky['label'], shaky['n']))}")
    print(f"wrote {out_dir}/profile.{{csv,json,md,png}} and exponents.csv ({len(frame)} cells)")
    failed = [row for row in rows if row.get("error")]
    if rows and len(failed) == len(rows):
        raise UserError(f"every cell failed (the first: {failed[0]['backend']} at n = {failed[0]['n']}: "
                        f"{failed[0]['error']}); see {out_dir / 'profile.md'}")
    broken = [row for row in failed if not is_limit(row["error"])]
    if broken:  # not a length beyond the device's memory or the time given: a cell that should have run
        raise UserError(f"{len(broken)} of {len(rows)} cells failed (the first: {broken[0]['backend']} at n = "
                        f"{broken[0].get('n')}: {broken[0]['error']}); see {out_dir / 'profile.md'}")


def is_limit(error: str) -> bool:
    """Whether a cell's error is a limit the profile measures (out of memory, or over timeout_s), not a failure."""
    return error == "out of memory" or error.startswith("timed out after ")


def check_dry_run(overrides: list) -> None:
    """``--cfg job|hydra|all``: the composed config is refused as the real run would refuse it."""
    from lra.commands.composition_errors import composed_for_dry_run
    from lra.validation import validate_tool

    validate_tool(composed_for_dry_run(PROFILE_CONF_DIR, "lra_profile", overrides))


def main() -> None:
    """Console entry: a config mistake becomes one line naming the valid keys; a Hydra folder that
    cannot be written (Hydra makes it first) one line too."""
    import sys

    from lra.commands.composition_errors import refuse_deleted_fields
    from lra.tool_configs import ProfileConfig

    config_errors.at_the_edge(check_folders_given)(sys.argv[1:], ("output_dir",))
    config_errors.at_the_edge(refuse_deleted_fields)(sys.argv[1:], ProfileConfig)
    config_errors.at_the_edge(check_hydra_output_overrides)(sys.argv[1:])
    config_errors.run_app(run, schema_keys(ProfileConfig), check_shown=check_dry_run)


if __name__ == "__main__":
    main()
