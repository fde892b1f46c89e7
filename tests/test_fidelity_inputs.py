"""lra-fidelity's inputs and verdicts: every list and scale is bounded by what the code can hold, a
repeat or an empty folder setting is one line, a measurement that is not finite is never a blank cell or
a "no", and a folder's files always describe one run."""

import json
import math

import pandas as pd
import pytest

from conftest import run_command
from lra.commands import fidelity
from lra.errors import ConfigError, UserError
from lra.fidelity import report
from test_tool_errors import compose_tool_config

HUGE = 10**400
REFUSED = [
    (f"yoso_hashes=[{HUGE}]", "yoso_hashes", "from 1 to 2^31 − 1 (YOSO's CUDA kernels count hashes in 32-bit"),
    (f"yoso_lengths=[{HUGE}]", "yoso_lengths", "from 1 to 2^20 (YOSO's hash codes have τ = ⌈log2 n⌉ ≤ 20 bits)"),
    ("yoso_lengths=[1048577]", "yoso_lengths", "from 1 to 2^20"),
    (f"seeds=[{HUGE}]", "seeds", "from 0 to 2^32 − 1 (numpy's seed range"),
    ("seeds=[4611686018427387904]", "seeds", "from 0 to 2^32 − 1"),
    (f"lengths=[{HUGE}]", "lengths", "from 1 to 2^20 (the exact softmax"),
    (f"oracle_budgets=[{HUGE}]", "oracle_budgets", "from 1 to 2^20"),
    (f"num_heads={HUGE}", "num_heads", "between 1 and 2^31 − 1"),
    (f"head_dim={HUGE}", "head_dim", "between 1 and 2^31 − 1"),
    ("score_std=1e308", "score_std", "a number in (0, 1e6] (q and k are float32"),
    ("score_std=1e160", "score_std", "a number in (0, 1e6]"),
    ("seeds=[0,0]", "seeds", "a list without repeats (0 is given twice"),
    ("sections=[yoso,yoso]", "sections", "a list without repeats (yoso is given twice"),
    ("backends=[softmax,yoso,softmax]", "backends", "a list without repeats (softmax"),
    ("yoso_hashes=[8,8]", "yoso_hashes", "a list without repeats (8"),
    ("checkpoint=' '", "checkpoint", "an lra-train run folder, or null"),
    ("output_dir=''", "output_dir", "give output_dir a folder, or leave it out"),
]


@pytest.mark.parametrize("override,key,rule", REFUSED, ids=[r[0][:40] for r in REFUSED])
def test_values_the_code_cannot_hold_and_repeats_are_one_config_line(override, key, rule):
    from lra.validation import validate_tool

    with pytest.raises(ConfigError) as error:
        validate_tool(compose_tool_config("lra-fidelity", ["preset=smoke", override]))
    line = str(error.value)
    assert line.startswith(f"invalid value for {key}: ") and rule in line and "\n" not in line, line


def test_the_largest_allowed_values_pass():
    from lra.validation import validate_tool

    validate_tool(compose_tool_config("lra-fidelity", [
        "preset=smoke", "score_std=1e6", f"seeds=[0,{2**32 - 1}]", f"yoso_lengths=[{2**20}]", f"yoso_hashes=[{2**31 - 1}]"]))


@pytest.mark.parametrize("argv,expected", [
    (["output_dir="], "output_dir is empty (an unset shell variable?); give output_dir a folder, or leave it out"),
    (["checkpoint=''"], "checkpoint is empty (an unset shell variable?); give checkpoint a folder, or leave it out"),
    (["~output_dir"], "~output_dir deletes a key every run needs"),
    (["~options"], "~options deletes a key every run needs"),
])
def test_empty_folder_settings_and_deleted_keys_are_refused_before_hydra(argv, expected):
    with pytest.raises(ConfigError) as error:
        fidelity.check_command_line(["preset=smoke", *argv])
    assert str(error.value).startswith(expected)


def test_the_dry_run_refuses_what_the_run_refuses():
    with pytest.raises(ConfigError, match=r"^invalid value for score_std: -1"):
        fidelity._validate_dry_run(["score_std=-1"])
    fidelity._validate_dry_run(["preset=smoke"])


def yoso_frame(angles: dict) -> pd.DataFrame:
    """{(m, n): [angle per seed]} → the yoso section's rows of random inputs."""
    return pd.DataFrame([{"input": "random", "n": n, "seed": seed, "m": m, "tau": 6, "relative_error": angle,
                          "mean_angle": angle} for (m, n), values in angles.items() for seed, angle in enumerate(values)])


def test_a_non_finite_measurement_is_marked_and_its_verdict_is_not_measured():
    frame = yoso_frame({(8, 64): [0.5, math.nan], (32, 64): [0.3, 0.3], (8, 128): [0.6, 0.6], (32, 128): [0.4, 0.4]})
    text = report.markdown({"yoso": frame}, "t")
    assert f"| {report.NON_FINITE}" in text and "**not measured: some mean angles came out non-finite" in text
    assert "**no**" not in text and "**yes**" not in text
    assert report.yoso_trend(frame).attrs["monotone_in_m"] is None
    everything = yoso_frame({(8, 64): [math.inf], (32, 64): [math.nan]})
    assert "**not measured" in report.markdown({"yoso": everything}, "t")
    failed = report.non_finite({"yoso": everything.to_dict("records")})
    assert failed == ["yoso: YOSO-8 on random n=64, seed 0", "yoso: YOSO-32 on random n=64, seed 0"]


def test_the_m_verdict_needs_two_hash_counts_and_is_yes_or_no_only_when_measured():
    single = yoso_frame({(32, 64): [0.5, 0.5], (32, 128): [0.6, 0.6]})
    assert "**not measured: it needs at least two hash counts, and yoso_hashes gives 1**" in report.markdown({"yoso": single}, "t")
    falling = yoso_frame({(8, 64): [0.5], (32, 64): [0.3]})
    assert report.yoso_trend(falling).attrs["verdict"] == "yes"
    assert report.yoso_trend(yoso_frame({(8, 64): [0.3], (32, 64): [0.5]})).attrs["verdict"] == "no"


def test_non_finite_values_are_spelled_out_in_the_csv_and_json(tmp_path):
    rows = {"yoso": [{"input": "random", "n": 64, "seed": 0, "m": 8, "tau": 6, "relative_error": math.inf,
                      "mean_angle": math.nan}]}
    report.write(rows, tmp_path, "t")
    (record,) = json.loads((tmp_path / "fidelity.json").read_text())["yoso"]
    assert record["relative_error"] == "inf" and record["mean_angle"] == "nan"
    assert (tmp_path / "fidelity_yoso.csv").read_text().splitlines()[1].endswith(",inf,nan")


def test_skipped_oracle_budgets_are_named_per_n():
    rows = [{"input": "random", "n": 128}, {"input": "random", "n": 512}, {"input": "listops layer 0", "n": 200}]
    said = fidelity.skipped_budgets(rows, [1, 256, 1024])
    assert said == ("Budgets larger than n are left out (every key would be kept): r = 256, 1024 at random n=128; "
                    "r = 1024 at random n=512; r = 256, 1024 at listops layer 0.")
    assert fidelity.skipped_budgets(rows[1:2], [1, 256]) == ""
    oracles = pd.DataFrame([{"input": "random", "n": 128, "seed": 0, "oracle": "v-oblivious", "r": 1,
                             "relative_error": 0.5, "mean_angle": 0.4}])
    assert said in report.markdown(report.frames({"oracles": oracles.to_dict("records")}), "t", {"oracles": said})


def test_a_run_removes_the_previous_runs_outputs_and_nothing_else(tmp_path):
    for name in [*report.output_names(), "notes.txt", "fidelity.log"]:
        (tmp_path / name).write_text("old")
    report.remove_outputs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fidelity.log", "notes.txt"]
    assert {"fidelity_backends.csv", "fidelity_oracles.png", "fidelity_config.yaml"} <= set(report.output_names())


def test_a_damaged_run_config_names_a_fix_for_capturing_not_resuming(tmp_path):
    from lra.fidelity import inputs
    from lra.run import RESOLVED

    (tmp_path / RESOLVED).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / RESOLVED).write_text("model: [unclosed")
    with pytest.raises(UserError) as error:
        inputs.load_run_config(tmp_path)
    line = str(error.value)
    assert line.startswith(f"cannot capture from checkpoint={tmp_path}: its {RESOLVED}, which says how to rebuild") and "resume" not in line
    assert "pass another run as checkpoint=" in line


def test_the_command_s_dry_run_refuses_an_invalid_config_with_one_line(tmp_path):
    result = run_command(["lra-fidelity", "--cfg", "job", "score_std=-1"], tmp_path, tmp_path, check=False)
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith("error: invalid value for score_std: -1"), result.stderr
    assert "score_std: -1" not in result.stdout  # the refused config is not printed


def test_a_cell_with_a_failed_seed_is_failed_in_every_table_and_left_out_of_the_means_and_plots(tmp_path):
    """The sparse summary and the plots averaged the seeds that did not raise, passing for the cell's mean."""
    where = {"input": "random", "n": 64}
    rows = {"backends": [
        {**where, "seed": 0, "backend": "lsh", "label": "LSH", "relative_error": 0.5, "mean_angle": 0.4,
         "keys_per_query": 8.0, "utility": 0.6},
        {**where, "seed": 1, "backend": "lsh", "label": "LSH", "error": "out of memory (…)"},
        {**where, "seed": 0, "backend": "local", "label": "Local Attention", "relative_error": 0.7, "mean_angle": 0.6,
         "keys_per_query": 16.0, "utility": 0.5},
        {**where, "seed": 1, "backend": "local", "label": "Local Attention", "relative_error": 0.9,
         "mean_angle": 0.8, "keys_per_query": 16.0, "utility": 0.7}]}
    text = report.markdown(report.frames(rows), "t")
    sparse = text.split("## Sparse backends")[1].split("## Measurements that failed")[0]
    assert "| LSH " not in sparse and "| Local Attention | " in sparse and " 0.8 " in sparse, sparse
    assert "| LSH " in text.split("## Sparse backends")[0] and "failed" in text.split("## Sparse backends")[0]
    assert report.failures(rows) == ["backends: LSH on random n=64, seed 1: out of memory (…)"]
    everything = {"backends": [row for row in rows["backends"] if row["backend"] == "lsh" and row.get("error")]}
    report.write(everything, tmp_path, "t")  # nothing measured: the report still writes, without a bar chart
    assert "failed" in (tmp_path / "fidelity.md").read_text()
