"""LRA Table 1 (experiment=lra_table1) and the learning-to-hash paper's LRA table (experiment=lha_table3):
every row × task composes, validates, and equals the configuration it cites (tests/lra_cited.py: each
value with its source); no preset file sets an uncited value; every row is a row of the paper's table;
a smoke sweep of every LRA row (ListOps), of the LRA code's per-row Pathfinder models, of the
learning-to-hash table's own rows (Image through tensorflow-datasets' mock data), and one job per
remaining task of each table (Text, Retrieval, Image on fixtures in the official layouts) runs end to
end; `lra-table --reference` prints each row, for the learning-to-hash table all eleven with their deltas."""

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from conftest import SMALL_LISTOPS, read_json, run_command
from helpers import compose_config, write_aan, write_aclimdb, write_cifar_python
from lra.config import CONF_DIR
from lra.results.reference import REFERENCES
from lra.results.rows import PAPER_NAMES
from lra.validation import attention_spec, validate
from lra_cited import DEVIATIONS, ENCODER, REFERENCE, ROW_TASKS, ROWS, SETUPS, TABLE_ROWS, TABLE_TASKS, expected

COMBINATIONS = [(table, row, task) for table in TABLE_ROWS for row in TABLE_ROWS[table] for task in TABLE_TASKS[table]]


@lru_cache(maxsize=None)
def composed(table: str, row: str, task: str):
    return compose_config(f"experiment={table}", f"setup={table}/{task}", f"row={row}")


def paper_numbers(reference: str) -> pd.DataFrame:
    """The shipped CSV of a paper's table: one row per method, one column per task (NaN where none)."""
    from importlib import resources

    csv = resources.files("lra.results").joinpath("paper_numbers", REFERENCES[reference])
    return pd.read_csv(csv, index_col=0, keep_default_na=False, na_values=[""])  # a row named "None" stays one


def paper_rows(reference: str) -> set:
    return set(paper_numbers(reference).index)


def sweep(table: str, group: str) -> list:
    return str(OmegaConf.load(CONF_DIR / "experiment" / f"{table}.yaml").hydra.sweeper.params[group]).split(",")


@pytest.mark.parametrize("table, row, task", COMBINATIONS, ids=["/".join(c) for c in COMBINATIONS])
def test_every_row_and_task_composes_validates_and_equals_what_it_cites(table, row, task):
    cfg = composed(table, row, task)
    validate(cfg)  # every schema rule and the backend's shape constraints, as lra-train runs them
    assert cfg.task.name == task and str(cfg.model.padding_mask.value) == "nonzero_ids"
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    for field, (value, source) in expected(table, row, task).items():
        group, key = field.split(".")
        assert resolved[group][key] == pytest.approx(value) if isinstance(value, float) else resolved[group][key] == value, \
            f"{table} {row} on {task}: {field} = {resolved[group][key]!r}, but {source} says {value!r}"


def flat_keys(path: Path) -> set:
    node = OmegaConf.load(path)
    return {f"{group}.{key}" for group in node if group != "defaults" for key in node[group]}


def test_no_preset_file_sets_a_value_without_a_cited_source():
    encoder = OmegaConf.load(CONF_DIR / "model" / "lra.yaml")
    assert {f"model.{key}" for key in encoder if key != "defaults"} == set(ENCODER), "conf/model/lra.yaml as cited"
    for setup, cited in SETUPS.items():
        assert flat_keys(CONF_DIR / "setup" / f"{setup}.yaml") <= set(cited), setup
    for row, cited in ROWS.items():
        own = flat_keys(CONF_DIR / "row" / f"{row}.yaml")
        assert own <= set(cited), f"{row} sets {sorted(own - set(cited))} without a source"
    files = sorted((CONF_DIR / "row").glob("*/*/*.yaml"))
    on_disk = {(f"{p.parent.parent.name}/{p.parent.name}", p.stem) for p in files} - {
        (f"yoso_table3/{p.parent.name}", p.stem) for p in files if p.parent.parent.name == "yoso_table3"}
    assert on_disk == set(ROW_TASKS), "a per-task file for every cited (row, task), and only those"
    for (row, task), cited in ROW_TASKS.items():
        own = flat_keys(CONF_DIR / "row" / row / f"{task}.yaml")
        assert own == set(cited), f"{row}/{task}.yaml sets {sorted(own ^ set(cited))} unlike its citations"


@pytest.mark.parametrize("table", sorted(TABLE_ROWS))
def test_each_table_sweeps_its_rows_and_each_row_is_a_row_of_the_paper(table):
    assert sweep(table, "row") == TABLE_ROWS[table]
    assert sweep(table, "setup") == [f"{table}/{task}" for task in TABLE_TASKS[table]]
    own = sorted(f"{table}/{p.stem}" for p in (CONF_DIR / "row" / table).glob("*.yaml"))
    assert own == sorted(r for r in TABLE_ROWS[table] if r.startswith(f"{table}/")), "every row file is swept"
    names = paper_rows(REFERENCE[table])
    labels = [attention_spec(composed(table, row, TABLE_TASKS[table][0])).label for row in TABLE_ROWS[table]]
    found = [({label, *PAPER_NAMES.get(label, [])} & names).pop() for label in labels]
    assert sorted(found) == sorted(names), f"{table}: every row of the paper, once"


def test_every_deviation_from_the_cited_code_is_documented():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "attention.md").read_text()
    section = docs[docs.index("## Paper presets and the configurations they cite"):]
    section = section[:section.index("\n## ", 3)]
    for row, phrase in DEVIATIONS.items():
        line = next((line for line in section.splitlines() if line.startswith(f"| `{row}` |")), "")
        assert phrase in line, f"{row}: its deviation ({phrase}) is not in docs/attention.md's table"


def test_the_efficiency_view_flags_rows_outside_the_parameter_budget():
    """LRA's ±10 % of the Softmax row: on Image the LRA code's own sizes put most rows outside."""
    from lra.model import Classifier

    counts = {}
    for row in ("lra_table1/transformer", "lra_table1/sinkhorn", "lra_table1/reformer"):
        cfg = composed("lra_table1", row, "image")
        model = Classifier(cfg.model, cfg.task, attention_spec(cfg), cfg.task.max_length + 1)
        counts[attention_spec(cfg).label] = sum(p.numel() for p in model.parameters())
    from lra.results.table import comparison

    runs = pd.DataFrame([{"label": label, "task": "image", "seed": 0, "status": "completed", "test_accuracy": 10.0,
                          "num_parameters": n} for label, n in counts.items()])
    budget = comparison(runs, efficiency=True)["image params vs Softmax"]
    assert budget["Softmax"] == "+0.0 %"
    assert budget["Sinkhorn Transformer"].endswith("(outside ±10 %)") and counts["Sinkhorn Transformer"] < counts["Softmax"]


# ----------------------------------------------------------------------------- end to end
SMOKE = ["trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2", "trainer.eval_subset=8"]


def run_sweep(tmp_path, data_dir, *overrides, folder=None):
    folder = folder or tmp_path / "sweep"
    run_command(["lra-train", "-m", *overrides, *SMOKE, f"hydra.sweep.dir={folder}"], tmp_path, data_dir)
    return folder, [read_json(p) for p in sorted(folder.rglob("metrics.json"))]


def table_rows(folder, tmp_path, data_dir, reference) -> list:
    csv = run_command(["lra-table", str(folder), "--reference", reference, "--format", "csv"], tmp_path, data_dir).stdout
    from io import StringIO

    return list(pd.read_csv(StringIO(csv))["backend"])


def test_every_lra_row_trains_on_listops_and_the_table_prints_each_with_its_paper_delta(tmp_path, data_dir):
    folder, records = run_sweep(tmp_path, data_dir, "experiment=lra_table1", "setup=lra_table1/listops", *SMALL_LISTOPS,
                                "model.num_layers=1", "model.dim=32", "model.num_heads=2", "model.head_dim=16",
                                "model.ff_dim=64", "model.classifier_dim=64")
    assert len(records) == 11 and all(r["status"] == "completed" for r in records), [r.get("error") for r in records]
    labels = {r["label"] for r in records}
    assert len(labels) == 11 and labels <= paper_rows("lra") | {"Softmax"}
    table = run_command(["lra-table", str(folder), "--reference", "lra"], tmp_path, data_dir).stdout
    assert all(f"| {label} " in table for label in labels) and table.count("[Δ ") == 11


def test_the_per_row_pathfinder_models_of_the_lra_code_train(tmp_path, data_dir):
    """Three rows whose Pathfinder models the LRA code sizes differently (generated Pathfinder)."""
    generator = ["task.generator.num_images=12", "task.generator.images_per_folder=12", "task.generator.workers=1"]
    folder, records = run_sweep(tmp_path, data_dir, "experiment=lra_table1", "setup=lra_table1/pathfinder",
                                "row=lra_table1/linformer,lra_table1/local,lra_table1/sinkhorn", *generator,
                                "trainer.train_subset=16")
    assert [r["status"] for r in records] == ["completed"] * 3, [r.get("error") for r in records]
    parameters = sorted(r["num_parameters"] for r in records)
    assert len(set(parameters)) == 3  # three model sizes
    assert set(table_rows(folder, tmp_path, data_dir, "lra")) == {"Linformer", "Local Attention", "Sinkhorn Transformer"}


def prepare_mock_image(data_dir):
    """A prepared Image cache from tensorflow-datasets' mock data: 24 random images per split."""
    tfds = pytest.importorskip("tensorflow_datasets")
    from hydra import compose, initialize_config_dir

    from lra.data.prepare import load_task_data

    rng = np.random.default_rng(0)

    def as_data_source(builder, split, *args, **kwargs):
        return [{"image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "label": i % 10, "id": str(i)}
                for i in range(24)]

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        task = compose(config_name="config", overrides=["task=image"]).task
    with tfds.testing.mock_data(as_data_source_fn=as_data_source):
        load_task_data(task, data_dir, announce=lambda message: None, prepare=True)


def test_the_learning_to_hash_table_trains_its_own_rows_on_image_and_prints_them(tmp_path):
    data_dir = tmp_path / "data"
    prepare_mock_image(data_dir)
    folder, records = run_sweep(tmp_path, data_dir, "experiment=lha_table3", "setup=lha_table3/image",
                                "row=lha_table3/lha,lha_table3/rfa", "trainer.train_subset=16", "trainer.max_length=256",
                                "model.num_layers=1")
    assert [r["status"] for r in records] == ["completed"] * 2, [r.get("error") for r in records]
    assert set(table_rows(folder, tmp_path, data_dir, "lha")) == {"LHA", "RFA"}


def prepare_mock_documents(data_dir, raw):
    """Prepared Text (aclImdb folders), Retrieval (the release's AAN pairs) and Image (CIFAR-10 pickles)
    caches from the fixtures in their official layouts (tests/helpers.py), in this process."""
    from lra.data.prepare import load_task_data

    sources = {"text": ["task.source=aclimdb", f"task.path={write_aclimdb(raw, per_folder=4)}"],
               "retrieval": ["task.source=lra_release", f"task.path={write_aan(raw).parent.parent}"],
               "image": ["task.source=cifar_python", f"task.path={write_cifar_python(raw, per_batch=8)}"]}
    for task, overrides in sources.items():
        load_task_data(compose_config(f"task={task}", *overrides).task, data_dir, announce=lambda m: None, prepare=True)


SHRUNK = ["model.num_layers=1", "model.dim=32", "model.num_heads=2", "model.head_dim=16", "model.ff_dim=64",
          "model.classifier_dim=64", "trainer.train_subset=16", "trainer.max_length=256"]


def test_each_document_task_of_both_tables_trains_once_on_mock_data(tmp_path):
    """The data paths the ListOps, Pathfinder and Image sweeps above leave out: one job per task and
    table, shrunk, on fixtures; each record is the row's on its task, Retrieval through the dual
    encoder, and the learning-to-hash Sinkhorn row pools as its LRA encoder can (mean; Retrieval CLS)."""
    data_dir = tmp_path / "data"
    prepare_mock_documents(data_dir, tmp_path / "raw")
    jobs = {}
    for table, tasks, row in (("lra_table1", ("text", "retrieval", "image"), "lra_table1/bigbird"),
                              ("lha_table3", ("text", "retrieval"), "lra_table1/sinkhorn")):
        folder, records = run_sweep(tmp_path, data_dir, f"experiment={table}", f"row={row}", *SHRUNK,
                                    "setup=" + ",".join(f"{table}/{task}" for task in tasks), folder=tmp_path / table)
        assert [r["status"] for r in records] == ["completed"] * len(tasks), [r.get("error") for r in records]
        for record, run in zip(records, sorted(p.parent for p in folder.rglob("metrics.json"))):
            jobs[table, record["task"]] = (record, OmegaConf.load(run / ".hydra" / "resolved.yaml"))
    assert sorted(jobs) == [("lha_table3", "retrieval"), ("lha_table3", "text"), ("lra_table1", "image"),
                            ("lra_table1", "retrieval"), ("lra_table1", "text")]
    assert {record["label"] for record, _ in jobs.values()} == {"BigBird", "Sinkhorn Transformer"}
    assert {table: str(cfg.model.pooling) for (table, task), (_, cfg) in jobs.items() if task == "text"} == \
        {"lra_table1": "cls", "lha_table3": "mean_unmasked"}
    for table in ("lra_table1", "lha_table3"):  # the dual head reads [X1, X2, X1 ⊙ X2, X1 − X2]: 3 · dim more inputs
        (text, text_cfg), (retrieval, retrieval_cfg) = jobs[table, "text"], jobs[table, "retrieval"]
        assert str(retrieval_cfg.model.pooling) == "cls" and retrieval_cfg.task.dual_encoder
        cls_token = 2 * 32 * (str(text_cfg.model.pooling) != "cls")  # Retrieval's CLS token and its position
        assert retrieval["num_parameters"] - text["num_parameters"] == 3 * 32 * 64 + cls_token


def test_lra_table_prints_every_row_of_the_learning_to_hash_table_with_its_paper_deltas(tmp_path, capsys):
    """One record per row × task (written here, each with the label its composed row gives): all eleven
    rows print, every cell's delta is the record's accuracy minus the paper's number (shipped CSV), and
    RFA's Image cell, which the paper leaves empty, has none."""
    import json

    from lra.commands.table import main as table_main

    paper = paper_numbers("lha")
    names = {}
    for i, row in enumerate(TABLE_ROWS["lha_table3"]):
        label = attention_spec(composed("lha_table3", row, "listops")).label
        names[label] = ({label, *PAPER_NAMES.get(label, [])} & set(paper.index)).pop()
        for j, task in enumerate(TABLE_TASKS["lha_table3"]):
            folder = tmp_path / f"{i}-{task}"
            folder.mkdir()
            (folder / "metrics.json").write_text(json.dumps({"label": label, "task": task, "seed": 0, "status": "completed",
                                                             "test_accuracy": 40.0 + i + j / 4}))
    assert sorted(names.values()) == sorted(paper.index)
    table_main([str(tmp_path), "--reference", "lha"])
    lines = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    assert set(names) <= set(lines) and len(names) == 11
    for label, name in names.items():
        assert lines[label].count("[Δ ") == paper.loc[name].notna().sum(), lines[label]  # 4 tasks and the average
    table_main([str(tmp_path), "--reference", "lha", "--format", "json"])
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) == 44
    for cell in cells:
        expected = paper.loc[names[cell["backend"]], cell["task"]]
        if pd.isna(expected):
            assert (names[cell["backend"]], cell["task"]) == ("RFA", "image") and cell["delta"] is None
        else:
            assert cell["paper"] == pytest.approx(expected) and cell["delta"] == pytest.approx(cell["mean"] - expected)
