"""lra-profile and lra-fidelity: a config mistake, or CUDA asked for where there is none, is one
line and exit 2; a profile whose every cell fails exits non-zero."""

import pytest

from conftest import run_command
from lra.errors import ConfigError


# ------------------------------------------------------------------------ lra-profile, lra-fidelity
TOOL_MISTAKES = [
    ("lra-profile", ["preset=smoke", "backends=[softmax,sofmax]"], "invalid value for backends: ['softmax', 'sofmax']"),
    ("lra-profile", ["preset=smoke", "lengths=[-8]"], "invalid value for lengths: [-8]"),
    ("lra-profile", ["preset=smoke", "mode=biggest"], "invalid value for mode: 'biggest'; it must be one of fixed, largest"),
    ("lra-fidelity", ["preset=smoke", "options.yoso.num_hashes=0"], "invalid value for options.yoso.num_hashes: 0"),
    ("lra-fidelity", ["preset=smoke", "seeds=[]"], "invalid value for seeds: []"),
    ("lra-fidelity", ["preset=smoke", "score_std=0"], "invalid value for score_std: 0"),
]
CUDA_ASKED = [("lra-profile", ["device=cuda"], "device=cuda"), ("lra-fidelity", ["yoso_impl=cuda"], "yoso_impl=cuda"),
              ("lra-fidelity", ["device=cuda"], "device=cuda")]


def compose_tool_config(command, overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from lra.config import FIDELITY_CONF_DIR, PROFILE_CONF_DIR, register_configs, register_resolvers

    register_resolvers()  # as the tools' commands do on import: their search path names the config folder,
    register_configs()  # and their configs extend the stored schemas
    root, name = {"lra-profile": (PROFILE_CONF_DIR, "lra_profile"), "lra-fidelity": (FIDELITY_CONF_DIR, "lra_fidelity")}[command]
    with initialize_config_dir(config_dir=str(root), version_base="1.3"):
        cfg = compose(config_name=name, overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):  # the tools' paths interpolate Hydra's run folder (never created here)
        cfg.hydra.runtime.output_dir = "out"
        HydraConfig.instance().set_config(cfg)
        del cfg.hydra
    return cfg


@pytest.mark.parametrize("command,args,expected", TOOL_MISTAKES, ids=[" ".join(c[1]) for c in TOOL_MISTAKES])
def test_tool_config_mistakes_are_one_line(command, args, expected):
    from lra.validation import validate_tool

    with pytest.raises(ConfigError) as error:
        validate_tool(compose_tool_config(command, args))
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)


@pytest.mark.parametrize("command,args,setting", CUDA_ASKED, ids=[f"{c[0]} {c[2]}" for c in CUDA_ASKED])
def test_asking_for_cuda_without_a_gpu_is_one_line(command, args, setting):
    import torch

    from lra.validation import validate_tool

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError) as error:
        validate_tool(compose_tool_config(command, ["preset=smoke", *args]))
    assert f"{setting} but this machine has no CUDA device" in str(error.value)


@pytest.mark.parametrize("command,args,expected", [TOOL_MISTAKES[1], TOOL_MISTAKES[3], CUDA_ASKED[1][:2] + ("no CUDA device",),
                                                   ("lra-profile", ["backends=[softmax]", "lengths=[64,64]"], "naming each once (64 more than once")])
def test_the_tools_end_a_config_mistake_with_one_line_and_exit_2(tmp_path, data_dir, command, args, expected):
    """The checks above, end to end through the console commands (the last one only without CUDA)."""
    if "cuda" in " ".join(args):
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
        args = ["preset=smoke", *args]
    result = run_command([command, *args, f"hydra.run.dir={tmp_path / 'out'}"], tmp_path, data_dir, check=False)
    (line,) = result.stderr.strip().splitlines()  # Hydra's "Error executing job" line was a second one
    assert result.returncode == 2 and line.startswith("error: ") and expected in line, result.stderr
    assert not (tmp_path / "out").exists(), "a refused config leaves no folder"


def test_a_profile_whose_every_cell_fails_exits_non_zero(tmp_path, data_dir):
    """Cells that all fail (the measuring process killed) still write their report; the command says
    so and exits 1."""
    result = run_command(["lra-profile", "preset=smoke", "backends=[softmax]", f"hydra.run.dir={tmp_path / 'out'}"],
                         tmp_path, data_dir, env_extra={"LRA_FAULT": "profile_cell:1"}, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "every cell failed" in last, result.stderr
    assert (tmp_path / "out" / "profile.md").is_file()


@pytest.mark.parametrize("command,override", [("lra-profile", "attention=softmax"), ("lra-fidelity", "task=listops")])
def test_lra_train_s_config_groups_given_to_a_tool_are_its_unknown_key_line(tmp_path, command, override):
    """A group of lra-train's config that the tool's config lacks (Hydra: "Could not override … No match in the
    defaults list"): the tool's unknown-key line with the keys it takes, exit 2, nothing written."""
    result = run_command([command, override], tmp_path, tmp_path / "data", check=False)
    key = override.split("=")[0]
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith(f"error: unknown key '{key}'; valid keys at the top level: ")
    assert "lengths" in line and not list(tmp_path.iterdir())
