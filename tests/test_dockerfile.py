"""The Dockerfile parses (one instruction per logical line, known instructions) and copies only
paths that exist. There is no Docker engine in CI; the image itself is built elsewhere."""

import shlex
from pathlib import Path

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


def test_dockerfile_parses_and_copies_existing_paths():
    parsed = instructions()
    assert parsed[0][0] == "FROM" and "devel" in parsed[0][1]
    assert all(keyword in INSTRUCTIONS for keyword, _ in parsed), parsed
    for keyword, arguments in parsed:
        if keyword == "COPY":
            *sources, _ = shlex.split(arguments)
            for source in sources:
                assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    runs = " ".join(arguments for keyword, arguments in parsed if keyword == "RUN")
    assert "attention_zoo._yoso_build cpu cuda" in runs  # kernels precompiled into the image
    assert ("ENTRYPOINT", '["lra-train"]') in parsed


def test_the_image_holds_every_config_root_the_commands_read():
    from lra import config

    copied = {shlex.split(arguments)[0] for keyword, arguments in instructions() if keyword == "COPY"}
    roots = {config.CONF_DIR.name, config.PROFILE_CONF_DIR.name, config.FIDELITY_CONF_DIR.name}
    assert roots <= copied, f"the Dockerfile does not copy {sorted(roots - copied)}"
