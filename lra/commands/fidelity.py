"""``lra-fidelity``: compose the config, gather the attention inputs (random, and captured from a
checkpoint when one is given), run each requested section on each, write the report."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from lra.commands import config_errors
from lra.commands.composition_errors import schema_keys
from lra.config import FIDELITY_CONF_DIR, register_configs, register_resolvers
from lra.errors import UserError
from lra.io import atomic_write_text, check_hydra_output_overrides

log = logging.getLogger("lra.fidelity")
register_configs()
register_resolvers()
SECTIONS = ("backends", "oracles", "yoso")


def measure(cfg, device) -> dict:
    """Every section's rows: random inputs at their lengths and seeds, then each captured layer."""
    from lra.fidelity import inputs as sources
    from lra.fidelity import sections

    options = OmegaConf.to_container(cfg.options, resolve=True)
    captured = (sources.captured_inputs(Path(cfg.checkpoint), cfg.examples, cfg.split, device)
                if cfg.checkpoint else [])
    first_seed = cfg.seeds[0]

    def random(lengths):
        for n in lengths:
            for seed in cfg.seeds:
                yield sources.random_inputs(cfg.batch_size, cfg.num_heads, int(n), cfg.head_dim, cfg.score_std,
                                            seed, device)

    rows = {section: [] for section in cfg.sections}
    for section in cfg.sections:
        lengths = cfg.yoso_lengths if section == "yoso" else cfg.lengths
        for inputs in [*random(lengths), *captured]:
            seed = first_seed if inputs.seed is None else inputs.seed
            log.info("%s: %s, n = %d, seed %s", section, inputs.source, inputs.n, inputs.seed)
            if section == "backends":
                rows[section] += sections.backend_rows(inputs, list(cfg.backends), options, seed,
                                                       failure_line=config_errors.failure_line)
            elif section == "oracles":
                budgets = sorted({int(r) for r in cfg.oracle_budgets if r <= inputs.n})
                rows[section] += sections.oracle_rows(inputs, budgets, cfg.oracle_queries, seed)
            else:
                rows[section] += sections.yoso_rows(inputs, list(cfg.yoso_hashes), cfg.yoso_impl, seed)
    return rows


@hydra.main(version_base="1.3", config_path=str(FIDELITY_CONF_DIR), config_name="lra_fidelity")
@config_errors.one_line_user_errors
def run(cfg: DictConfig) -> None:
    from lra.checkpoint import BEST, LAST
    from lra.fidelity import inputs as sources
    from lra.fidelity import report
    from lra.build import resolve_device
    from lra.commands.profile import tool_output_dir
    from lra.validation import validate_tool

    validate_tool(cfg)
    out_dir = tool_output_dir(cfg, reads=_reads(cfg.checkpoint))
    where = ""
    if cfg.checkpoint:
        sources.load_run_config(Path(cfg.checkpoint))  # a run folder, else one line
        weights = sources.checkpoint_weights(Path(cfg.checkpoint))
        where = f"; captured from {cfg.checkpoint}, {sources.NO_BEST if weights.name == LAST else weights.name}"
        if weights.name == LAST:
            log.warning("%s has no %s (it has not validated yet): measuring %s, its latest weights; every captured "
                        "input says so", cfg.checkpoint, BEST, LAST)
    device = resolve_device(cfg.device, announce=log.info)
    rows = measure(cfg, device)
    title = (f"attention fidelity on {device}: random q, k, v of {cfg.num_heads} heads × {cfg.head_dim} "
             f"(q·k/√d std {cfg.score_std}), seeds {list(cfg.seeds)}{where}")
    # A folder's files describe one run: an earlier one's go once this one's inputs were taken and measured
    report.remove_outputs(out_dir)
    report.write(rows, out_dir, title, {"oracles": skipped_budgets(rows.get("oracles", []), cfg.oracle_budgets)})
    atomic_write_text(out_dir / "fidelity_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    print((out_dir / "fidelity.md").read_text())
    print(f"wrote {out_dir}/fidelity.{{md,json}}, fidelity_<section>.csv and .png")
    raised = report.failures(rows)
    if raised:
        log.warning("%d measurement(s) failed:\n%s", len(raised), "\n".join(raised))
        raise UserError(f"{len(raised)} measurement(s) failed, marked {report.FAILED!r} in {out_dir}/fidelity.md (the "
                        f"others were measured): {raised[0]}" + ("; …" if len(raised) > 1 else ""))
    failed = report.non_finite(rows)
    if failed:
        raise UserError(f"{len(failed)} measurement(s) came out non-finite (NaN or ∞), marked {report.NON_FINITE!r} in "
                        f"{out_dir}/fidelity.md: {'; '.join(failed[:3])}{'; …' if len(failed) > 3 else ''}; the "
                        "backend overflowed on these inputs: try a smaller score_std, or leave that backend out")


def skipped_budgets(rows: list, budgets) -> str:
    """The sentence naming the oracle budgets r > n left out at each n (there every key is kept: the
    exact attention itself), or "" when none was."""
    inputs = dict.fromkeys((row["input"], row["n"]) for row in rows)
    skipped = [(source, n, [r for r in budgets if r > n]) for source, n in inputs]
    said = [f"r = {', '.join(map(str, rs))} at {'random n=' + str(n) if source == 'random' else source}"
            for source, n, rs in skipped if rs]
    return f"Budgets larger than n are left out (every key would be kept): {'; '.join(said)}." if said else ""


def _reads(run_dir) -> list:
    """The folders lra-fidelity reads when it captures from a run: never its output folder."""
    return [] if not run_dir else [Path(run_dir), Path(run_dir) / "checkpoints", Path(run_dir) / ".hydra"]


def main() -> None:
    """Console entry: a config mistake becomes one line naming the valid keys; a Hydra folder that
    cannot be written (Hydra makes it first) one line too."""
    import sys

    from lra.tool_configs import FidelityConfig

    config_errors.at_the_edge(check_command_line)(sys.argv[1:])
    checkpoints = [a.partition("=")[2] for a in sys.argv[1:] if a.partition("=")[0].lstrip("+") == "checkpoint"]
    config_errors.at_the_edge(check_hydra_output_overrides)(sys.argv[1:], _reads(checkpoints[-1] if checkpoints else None))
    config_errors.run_app(run, schema_keys(FidelityConfig), check_shown=_validate_dry_run)


def check_command_line(argv) -> None:
    """Before Hydra composes: an empty folder setting (an unset shell variable) and a deleted top-level
    key (``~output_dir`` fails inside Hydra's composition, its run folder not yet known) are one line."""
    from lra.commands.composition_errors import refuse_deleted_fields
    from lra.io import check_folders_given
    from lra.tool_configs import FidelityConfig

    check_folders_given(argv, ("output_dir", "checkpoint"))
    refuse_deleted_fields(argv, FidelityConfig)


def _validate_dry_run(overrides: list) -> None:
    """``--cfg job|hydra|all``: the config Hydra would print is refused as the real run refuses it."""
    from lra.commands.composition_errors import composed_for_dry_run
    from lra.validation import validate_tool

    validate_tool(composed_for_dry_run(FIDELITY_CONF_DIR, "lra_fidelity", overrides))


if __name__ == "__main__":
    main()
