"""A backend of your own in one file outside the package: ``LRA_ATTENTION_MODULES`` names it, lra-train
trains it by name with its options' defaults (no preset needed, a preset of yours still wins), a resume
without the variable says so, and a module that fails to import is one line naming it and where."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attention_zoo import user_modules
from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs

BACKEND = '''
from dataclasses import dataclass

import torch

import attention_zoo
from attention_zoo.options import number


@dataclass
class TemperedOptions:
    temperature: float = 2.0

    def __post_init__(self):
        number(self, "temperature", 0.0)


@attention_zoo.register("tempered", TemperedOptions)
class Tempered(attention_zoo.Attention):
    def forward(self, q, k, v, mask=None):
        scores = q @ k.transpose(-1, -2) / (self.options.temperature * q.shape[-1] ** 0.5)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        return torch.softmax(scores, dim=-1) @ v
'''
RUN = ["trainer=smoke", "trainer.max_steps=2", "model.num_layers=1", *SMALL_LISTOPS]


def test_a_backend_in_a_file_of_yours_trains_by_name_and_its_resume_needs_the_file(tmp_path, data_dir):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "tempered.py").write_text(BACKEND)
    named = {"LRA_ATTENTION_MODULES": str(tmp_path / "mine" / "tempered.py")}
    run_command(["lra-train", "attention=tempered", "attention.temperature=4", *RUN], tmp_path, data_dir,
                env_extra=named)
    (run,) = run_dirs(tmp_path)
    record = read_json(run / "metrics.json")
    assert (record["status"], record["attention"]) == ("completed", "tempered")
    assert "  name: tempered\n  temperature: 4.0\n" in (run / ".hydra" / "resolved.yaml").read_text()
    killed = run_command(["lra-train", "attention=tempered", *RUN, "hydra.run.dir=killed"], tmp_path, data_dir,
                         env_extra={**named, "LRA_FAULT": "step:2:SIGKILL"}, check=False)
    assert killed.returncode != 0
    resumed = run_command(["lra-train", "resume=killed"], tmp_path, data_dir, check=False)
    assert resumed.returncode == 2 and resumed.stderr.strip().splitlines()[-1].startswith(
        "error: attention 'tempered' is registered by no module imported here (LRA_ATTENTION_MODULES: unset): a "
        "backend of your own needs its module named there; registered: bigbird, "), resumed.stderr


def test_its_defaults_stand_in_for_a_preset_and_check_its_keys_and_a_preset_of_yours_wins(tmp_path):
    """The structured defaults stand in only for a backend without a preset: a preset in hydra.searchpath wins."""
    (tmp_path / "tempered.py").write_text(BACKEND)
    (tmp_path / "conf" / "attention").mkdir(parents=True)
    (tmp_path / "conf" / "attention" / "tempered.yaml").write_text(
        "defaults:\n  - /schema_attention_tempered@_here_\ntemperature: 5.0\n")
    script = """
import sys
from helpers import compose_config
from lra.config import register_configs
from lra.errors import ConfigError
from lra.validation import validate
register_configs()
print(compose_config("attention=tempered").attention.temperature)
print(compose_config(f"hydra.searchpath=[file://{sys.argv[1]}]", "attention=tempered").attention.temperature)
try:
    validate(compose_config("attention=tempered", "+attention.temprature=4"))
except ConfigError as error:
    print(error)
"""
    shown = subprocess.run([sys.executable, "-c", script, str(tmp_path / "conf")], capture_output=True, text=True,
                           cwd=tmp_path, env={**os.environ, "LRA_ATTENTION_MODULES": str(tmp_path / "tempered.py"),
                                              "PYTHONPATH": str(Path(__file__).parent)})
    assert shown.stdout.splitlines() == ["2.0", "5.0", "unknown key 'attention.temprature' (did you mean 'temperature'?); "
                                         "valid keys under attention: name, temperature"], shown.stderr[-2000:]


def test_a_run_records_the_file_of_your_backend_and_resumes_only_with_that_code(tmp_path, data_dir):
    """The harness's git commit does not name your code: the record holds the file and its SHA-256, and a
    resume with the file edited (or another file registering the name) is one line, not half a run of each."""
    import hashlib

    mine = tmp_path / "tempered.py"
    mine.write_text(BACKEND)
    named = {"LRA_ATTENTION_MODULES": str(mine)}
    chain = ["trainer.max_steps=4", "trainer.checkpoint_every=2", "trainer.eval_every=2", "hydra.run.dir=killed"]
    killed = run_command(["lra-train", "attention=tempered", *RUN, *chain], tmp_path, data_dir,
                         env_extra={**named, "LRA_FAULT": "step:3:SIGKILL"}, check=False)
    assert killed.returncode != 0 and (tmp_path / "killed" / "checkpoints" / "last.pt").is_file()
    record = read_json(tmp_path / "killed" / "metrics.json")
    digest = hashlib.sha256(BACKEND.encode()).hexdigest()
    assert (record["attention_file"], record["attention_file_sha256"]) == (str(mine), digest)
    mine.write_text(BACKEND.replace("torch.softmax(scores, dim=-1) @ v", "v * 1.0"))
    refused = run_command(["lra-train", "resume=killed"], tmp_path, data_dir, env_extra=named, check=False)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        f"error: cannot resume from {tmp_path / 'killed' / 'checkpoints' / 'last.pt'}: it was trained by a backend of "
        f"yours defined in a file of SHA-256 {digest[:12]}… and this process computes it with {mine}, whose SHA-256 is "
        f"now {hashlib.sha256(mine.read_bytes()).hexdigest()[:12]}…: a run goes on only with the code it began with; "
        "restore that file (LRA_ATTENTION_MODULES), or start a new run with the same overrides; the run's "
        "metrics.json is left as it was"), refused.stderr
    assert read_json(tmp_path / "killed" / "metrics.json") == record
    measured = run_command(["lra-fidelity", "preset=smoke", "checkpoint=killed", "hydra.run.dir=fidelity"], tmp_path,
                           data_dir, env_extra=named, check=False)  # its weights mean nothing to the edited code
    assert measured.returncode == 1 and measured.stderr.strip().splitlines()[-1].startswith(
        f"error: cannot capture from checkpoint=killed: it was trained by a backend of yours defined in a file of "
        f"SHA-256 {digest[:12]}… ({mine}) and this process has {mine}, of SHA-256 "), measured.stderr
    mine.write_text(BACKEND)
    run_command(["lra-train", "resume=killed"], tmp_path, data_dir, env_extra=named)
    assert read_json(tmp_path / "killed" / "metrics.json")["status"] == "completed"
    import attention_zoo

    assert user_modules.source_of(attention_zoo.get("softmax").cls) is None  # a built-in's code: the git commit's


@pytest.mark.parametrize("forward, said", [
    ("raise ValueError('my slip')", "ValueError: my slip ({log}): it comes from the code of your attention backend "
                                    "({file}, line 24); fix it there"),
    ("return v[:, :, :-1]", "BackendError: attention_zoo_user_tempered.Tempered.forward returned shape"),
])
def test_a_failure_in_the_code_of_your_backend_is_blamed_on_it_not_on_the_harness(tmp_path, data_dir, forward, said):
    """Its errors were called bugs in the harness, to be reported to the harness's authors."""
    mine = tmp_path / "tempered.py"
    mine.write_text(BACKEND.replace("return torch.softmax(scores, dim=-1) @ v", forward))
    failed = run_command(["lra-train", "attention=tempered", *RUN, "hydra.run.dir=run"], tmp_path, data_dir,
                         env_extra={"LRA_ATTENTION_MODULES": str(mine)}, check=False)
    line = failed.stderr.strip().splitlines()[-1]
    assert failed.returncode == 1 and line.startswith("error: " + said.format(
        log=f"its traceback is in {tmp_path / 'run' / 'train.log'}", file=mine)), failed.stderr
    assert line.endswith(f"it comes from the code of your attention backend ({mine}{', line 24' * ('slip' in forward)}); "
                         "fix it there") and "bug in the harness" not in line
    assert read_json(tmp_path / "run" / "metrics.json")["status"] == "failed"


@pytest.mark.parametrize("entry, write, said", [
    ("{tmp}/broken.py", "import torch\n\nx = torh.zeros(1)\n",
     "{tmp}/broken.py failed to import: NameError: name 'torh' is not defined (broken.py, line 3)"),
    ("{tmp}/syntax.py", "def forward(:\n", "{tmp}/syntax.py failed to import: SyntaxError: invalid syntax (syntax.py, "
                                           "line 1)"),
    ("{tmp}/missing.py", None, "{tmp}/missing.py is not a file; name a .py file that registers your backend, or a "
                               "module path such as mylab.attention"),
    ("no_such.module", None, "no_such.module failed to import: ModuleNotFoundError: No module named 'no_such'"),
    ("{tmp}/a.py:{tmp}/b.py", None, "{tmp}/a.py:{tmp}/b.py is not a file (entries are separated by commas, not "
                                    "colons)"),
    ("{tmp}/exits.py", "import sys\n\nsys.exit(3)\n", "{tmp}/exits.py exited while it was imported (SystemExit 3 "
                                                   "(exits.py, line 3)): a module that registers backends must not "
                                                   "parse the command line or exit at import"),
    ("{tmp}/parses.py", "import argparse\n\nargparse.ArgumentParser().parse_args(['--x'])\n",
     "{tmp}/parses.py exited while it was imported (SystemExit 2 (parses.py, line 3))"),
])
def test_a_module_of_yours_that_cannot_be_imported_is_one_line_naming_it(tmp_path, entry, write, said):
    entry, said = entry.format(tmp=tmp_path), said.format(tmp=tmp_path)
    if write is not None:
        (tmp_path / entry.rsplit("/", 1)[1]).write_text(write)
    with pytest.raises(user_modules.UserModuleError) as error:
        user_modules.import_all(f" {entry} ,")
    assert str(error.value).startswith(f"LRA_ATTENTION_MODULES: {said}") and "\n" not in str(error.value)


def test_lra_train_and_the_api_stop_on_it_before_anything_runs(tmp_path, data_dir):
    """Hydra called the backend an unknown choice; the API, build() of any backend, says why instead."""
    (tmp_path / "broken.py").write_text("raise RuntimeError('my bug\\nsecond line')\n")
    named = {"LRA_ATTENTION_MODULES": str(tmp_path / "broken.py")}
    line = (f"LRA_ATTENTION_MODULES: {tmp_path / 'broken.py'} failed to import: RuntimeError: my bug (broken.py, line "
            "1); fix it, or take it out of LRA_ATTENTION_MODULES")
    refused = run_command(["lra-train", "attention=tempered", *RUN], tmp_path, data_dir, env_extra=named, check=False)
    assert refused.returncode == 2 and refused.stderr.strip() == f"error: {line}", refused.stderr
    assert not (tmp_path / "runs").exists()
    api = subprocess.run([sys.executable, "-c", "import attention_zoo, json; print(json.dumps(attention_zoo.names()));"
                          "attention_zoo.build('softmax', num_heads=1, head_dim=4, max_seq_len=4)"],
                         capture_output=True, text=True, env={**os.environ, **named})
    assert "softmax" in json.loads(api.stdout) and api.stderr.strip().splitlines()[-1] == \
        f"attention_zoo.user_modules.UserModuleError: {line}"


def test_an_auxiliary_loss_that_is_not_finite_is_named_at_its_step(tmp_path, data_dir):
    """It was added to the objective unchecked: the weights went NaN and the next steps' loss was blamed on the
    learning rate."""
    (tmp_path / "aux.py").write_text(BACKEND.replace(
        "        return torch.softmax(scores, dim=-1) @ v",
        "        self.aux_loss = q.float().sum() * float('nan')\n        return torch.softmax(scores, dim=-1) @ v"))
    diverged = run_command(["lra-train", "attention=tempered", *RUN, "trainer.log_every=1"], tmp_path, data_dir,
                           env_extra={"LRA_ATTENTION_MODULES": str(tmp_path / "aux.py")}, check=False)
    assert diverged.returncode == 1 and diverged.stderr.strip().splitlines()[-1] == (
        "error: the attention backend's auxiliary loss (aux_loss) was not finite at a step between 1 and 1 (read "
        "every trainer.log_every steps); no checkpoint was written after it: the backend's own loss diverged (a "
        "lower trainer.lr or trainer.grad_clip may hold it)"), diverged.stderr


def window_of(*steps):
    """A TrainWindow over steps given as (loss, aux_loss or None), as Trainer.device_step reports them."""
    import torch

    from lra.train_window import TrainWindow

    window = TrainWindow()
    for loss, aux in steps:
        loss = torch.tensor(loss)
        metrics = {"loss": loss, "correct": torch.tensor(1), "examples": 4,
                   "nonfinite": ~torch.isfinite(loss if aux is None else loss + aux)}
        window.add(metrics if aux is None else {**metrics, "aux_loss": torch.tensor(aux)})
    return window


@pytest.mark.parametrize("steps, blamed", [
    ([(1.0, float("nan")), (float("nan"), float("nan"))], "auxiliary loss"),
    ([(1.0, float("inf")), (1.0, 0.5)], "auxiliary loss"),
    ([(float("nan"), 0.5), (float("nan"), float("nan"))], "training loss"),  # its NaN weights, then the aux's
    ([(1.0, 0.5), (float("inf"), None)], "training loss"),  # a step without aux_loss: loss · 0 was read as its NaN
])
def test_a_non_finite_window_blames_the_loss_that_was_non_finite_first(steps, blamed):
    from lra.distributed import Ranks
    from lra.errors import TrainingDiverged

    with pytest.raises(TrainingDiverged, match=f"^the {'attention backend.s ' if blamed[0] == 'a' else ''}{blamed}"):
        window_of(*steps).read(Ranks(), step=2)
    assert window_of((1.0, 0.5), (2.0, None)).read(Ranks(), step=2)["train/aux_loss"] == 0.25


@pytest.mark.parametrize("steps, step, said", [
    ([(float("nan"), None), (float("nan"), None)], 2, "at step 1, before any update, so neither the learning rate"),
    ([(1.0, None), (float("nan"), None)], 2, "at a step between 1 and 2 (read every trainer.log_every steps); no "
                                             "checkpoint was written after it: start a new run with a lower trainer.lr"),
    ([(float("nan"), None), (float("nan"), None)], 3, "at a step between 2 and 3"),  # updates came before
])
def test_a_loss_not_finite_from_the_first_step_is_not_blamed_on_the_learning_rate(steps, step, said):
    """A backend whose output is NaN on the first batch: no update had happened, yet the line advised a lower
    learning rate or gradient clipping."""
    from lra.distributed import Ranks
    from lra.errors import TrainingDiverged

    with pytest.raises(TrainingDiverged, match="^the training loss was not finite " + said.replace("(", r"\(")
                       .replace(")", r"\)")):
        window_of(*steps).read(Ranks(), step=step)


@pytest.fixture
def imported_here():
    """Modules imported in this process by a test, and their backends, taken out again after it."""
    from attention_zoo import registry

    modules, backends, files = set(sys.modules), dict(registry._REGISTRY), set(user_modules._IMPORTED)
    yield
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    registry._REGISTRY.clear()
    registry._REGISTRY.update(backends)
    user_modules._IMPORTED.clear()
    user_modules._IMPORTED.update(files)


def test_a_module_path_in_the_working_folder_imports_from_a_console_script(tmp_path, monkeypatch, imported_here):
    """As the docs say; a console script (lra-train) has its own folder, not the working one, on sys.path."""
    (tmp_path / "mylab_pkg").mkdir()
    (tmp_path / "mylab_pkg" / "__init__.py").write_text("")
    (tmp_path / "mylab_pkg" / "tempered.py").write_text(BACKEND.replace('"tempered"', '"tempered_pkg"'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    user_modules.import_all("mylab_pkg.tempered")
    import attention_zoo

    assert attention_zoo.get("tempered_pkg").cls.__module__ == "mylab_pkg.tempered"


def test_a_file_named_twice_is_imported_once_and_two_files_of_one_name_are_refused(tmp_path, monkeypatch,
                                                                                    imported_here):
    """Two files of one name were imported as one module: the second replaced the first's backend (the same class
    name and backend name) without a word."""
    import attention_zoo

    for folder, default in (("a", "3.0"), ("b", "2.0")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mine.py").write_text(
            BACKEND.replace('"tempered"', '"tempered_twice"').replace("= 2.0", f"= {default}")
            + "\nopen(__file__ + '.runs', 'a').write('x')\n")
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "a" / "mine.py"
    user_modules.import_all(f"a/mine.py, {first}, ./a/../a/mine.py")
    assert (tmp_path / "a" / "mine.py.runs").read_text() == "x"
    with pytest.raises(user_modules.UserModuleError) as error:
        user_modules.import_all("b/mine.py")
    assert str(error.value) == (
        f"LRA_ATTENTION_MODULES: b/mine.py has the file name of {first}, imported before it (both would be module "
        "attention_zoo_user_mine): rename one of them")
    assert attention_zoo.build("tempered_twice", num_heads=1, head_dim=4, max_seq_len=4).options.temperature == 3.0


def test_a_name_taken_by_a_built_in_is_placed_in_your_file(tmp_path):
    (tmp_path / "taken.py").write_text(BACKEND.replace('"tempered"', '"softmax"'))
    with pytest.raises(user_modules.UserModuleError) as error:
        user_modules.import_all(str(tmp_path / "taken.py"))
    assert "attention backend name 'softmax' is taken by attention_zoo.softmax.SoftmaxAttention" in str(error.value)
    assert str(error.value).endswith("(taken.py, line 18); fix it, or take it out of LRA_ATTENTION_MODULES")


def test_lra_fidelity_measures_every_other_backend_when_one_raises_and_names_it(tmp_path):
    """A backend that raised at one length (here: out of memory) ended lra-fidelity at that error, with no
    report of the backends measured before it. Now its cells read "failed", its line is under the tables and in the CSV, the
    others are measured as alone, and the command exits 1 naming it."""
    import pandas as pd
    import torch
    import yaml

    from lra.fidelity import inputs as sources
    from lra.fidelity import sections

    mine = tmp_path / "tempered.py"
    mine.write_text(BACKEND.replace("        return torch.softmax", "        if q.shape[2] > 40:\n"
                                    "            raise MemoryError('too long for me')\n        return torch.softmax"))
    result = run_command(["lra-fidelity", "preset=smoke", "sections=[backends]", "lengths=[32,96]", "seeds=[0]",
                          "backends=[softmax,tempered,local]", "hydra.run.dir=out"], tmp_path, tmp_path,
                         env_extra={"LRA_ATTENTION_MODULES": str(mine)}, check=False)
    line = result.stderr.strip().splitlines()[-1]
    said = ("backends: tempered on random n=96, seed 0: out of memory (too long for me); leave the longest of lengths "
            "(or yoso_lengths) out, or lower batch_size or num_heads")  # not lra-train's advice
    assert result.returncode == 1 and line == (f"error: 1 measurement(s) failed, marked 'failed' in {tmp_path / 'out'}"
                                               f"/fidelity.md (the others were measured): {said}"), result.stderr
    report = (tmp_path / "out" / "fidelity.md").read_text()
    assert re.search(r"\| tempered +\| +0\.\d+ +\| failed +\|", report), report
    assert ("## Measurements that failed\n\nThe other backends were measured; each line is the error of one:\n\n- "
            + said.removeprefix("backends: ") + "\n") in report, report
    rows = pd.read_csv(tmp_path / "out" / "fidelity_backends.csv")
    failed = rows[rows["error"].notna()]
    assert list(zip(failed["backend"], failed["n"])) == [("tempered", 96)]
    assert list(rows["backend"]) == ["softmax", "tempered", "local"] * 2  # the order asked
    config = yaml.safe_load((tmp_path / "out" / "fidelity_config.yaml").read_text())
    inputs = sources.random_inputs(config["batch_size"], config["num_heads"], 96, config["head_dim"],
                                   config["score_std"], 0, torch.device("cpu"))
    (alone,) = sections.backend_rows(inputs, ["local"], {}, 0)
    measured = rows[(rows["backend"] == "local") & (rows["n"] == 96)].iloc[0]
    assert measured["relative_error"] == pytest.approx(alone["relative_error"], rel=1e-12) and alone["relative_error"] > 0.1
