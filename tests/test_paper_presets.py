"""The paper presets: every row of experiment=yoso_table3 and experiment=lra_table1 is a backend
whose label is a row of the paper's shipped table, with the reference's quirks on; a smoke sweep of
each runs end to end and compares with the paper through lra-table."""

from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

import attention_zoo
from conftest import SMALL_LISTOPS, read_json, run_command
from lra.config import CONF_DIR
from lra.model import Classifier
from lra.results.table import PAPER_NAMES, REFERENCES
from test_config import compose_config

PAPERS = {"yoso_table3": "yoso", "lra_table1": "lra"}


def sweep_list(experiment: str, group: str) -> list:
    params = OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml").hydra.sweeper.params
    return str(params[group]).split(",")


def paper_rows(reference: str) -> set:
    from importlib import resources

    table = resources.files("lra.results").joinpath("paper_numbers", REFERENCES[reference])
    return set(pd.read_csv(table, keep_default_na=False).iloc[:, 0])


@pytest.mark.parametrize("experiment", sorted(PAPERS))
def test_every_row_is_listed_and_names_a_row_of_the_paper(experiment):
    rows = sweep_list(experiment, "row")
    on_disk = sorted(f"{experiment}/{p.stem}" for p in (CONF_DIR / "row" / experiment).glob("*.yaml"))
    assert sorted(rows) == on_disk, "the sweep lists every row file, and only those"
    names = paper_rows(PAPERS[experiment])
    labels = []
    for row in rows:
        cfg = compose_config(f"experiment={experiment}", f"row={row}")
        options = {k: v for k, v in OmegaConf.to_container(cfg.attention, resolve=True).items() if k != "name"}
        label = attention_zoo.label(cfg.attention.name, **options)
        assert {label, *PAPER_NAMES.get(label, [])} & names, f"{row}: label {label} is not a row of the paper"
        assert str(cfg.model.padding_mask.value) == "nonzero_ids", "the reference's ids != 0 mask"
        labels.append(label)
    assert len(set(labels)) == len(labels), "two rows with one label would share a table row"


def test_yoso_table3_rows_carry_the_table_settings():
    def attention(row):
        return compose_config("experiment=yoso_table3", f"row=yoso_table3/{row}").attention

    assert attention("star_yoso_c_16").backward == "exact" and attention("star_yoso_c_16").num_hashes == 16
    assert attention("yoso_32").backward_projections is None  # the paper's per-pair estimator
    assert attention("yoso_e").backward == "lower_bound"
    assert (attention("nystromformer").landmarks, attention("nystromformer").pinv_init) == ("padded_segments", "batch")
    assert compose_config("experiment=yoso_table3").model.pooling.value == "mean_unmasked"
    for task, tau_length in (("listops", 2048), ("text", 4096), ("image", 1024)):
        assert compose_config("experiment=yoso_table3", f"task={task}").task.max_length == tau_length


@pytest.mark.parametrize("setup", sweep_list("lra_table1", "setup"))
def test_lra_table1_setups_build_their_model(setup):
    cfg = compose_config("experiment=lra_table1", f"setup={setup}", "row=lra_table1/transformer")
    assert cfg.task.name == Path(setup).name
    model = Classifier(cfg.model, cfg.task, "softmax", {}, 64)
    width = {"listops": 512, "text": 256, "retrieval": 128, "image": 32, "pathfinder": 32}[cfg.task.name]
    assert model.encoder.norm.normalized_shape == (width,)
    assert str(cfg.trainer.lr_schedule.value) in ("rsqrt", "cosine")


def run_sweep(tmp_path, data_dir, *overrides):
    sweep = tmp_path / "sweep"
    args = ["lra-train", "-m", *overrides, "trainer=smoke", "trainer.max_steps=2", *SMALL_LISTOPS,
            f"hydra.sweep.dir={sweep}"]
    run_command(args, tmp_path, data_dir)
    records = [read_json(p) for p in sorted(sweep.rglob("metrics.json"))]
    return sweep, records


def test_yoso_table3_smoke_sweep_completes_every_row_and_lines_up_with_the_paper(tmp_path, data_dir):
    sweep, records = run_sweep(tmp_path, data_dir, "experiment=yoso_table3", "task=listops")
    assert len(records) == 12 and all(r["status"] == "completed" for r in records)
    table = run_command(["lra-table", str(sweep), "--reference", "yoso", "--format", "csv"], tmp_path, data_dir).stdout
    assert set(r["label"] for r in records) <= paper_rows("yoso")
    assert "*YOSO-C-16" in table and "Nystromformer" in table


def test_lra_table1_smoke_sweep_completes_every_row(tmp_path, data_dir):
    _, records = run_sweep(tmp_path, data_dir, "experiment=lra_table1", "setup=lra_table1/listops",
                           "model.num_layers=2", "model.dim=64", "model.num_heads=2", "model.head_dim=32")
    assert len(records) == 5 and all(r["status"] == "completed" for r in records)
    assert {r["label"] for r in records} == {"Softmax", "Longformer", "Linformer", "Reformer", "Performer"}
