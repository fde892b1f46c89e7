"""A damaged kernel cache and a build the environment breaks. A finished build records its library's
size and SHA-256; a library that no longer matches (truncated, emptied, altered, or recorded by an
older harness) is rebuilt from an empty folder before anything loads it (loading a truncated library
was a SIGBUS), and ``lra-build-kernels --force`` rebuilds an intact one. A build that fails because of
a setting is one ``error:`` line: the compiler's first error, the setting, the fix, and the log that
holds the full output. A torch without CUDA support says so before anything else."""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attention_zoo import _yoso_build
from attention_zoo._yoso_build import COMPLETE_STAMP, BuildPlan, KernelUnavailable
from conftest import SMALL_LISTOPS, run_command
from helpers import needs_kernels

CPU = BuildPlan("cpu", "", "")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A kernel cache whose 'compiler' writes a small library and whose 'import' records what it read:
    the checks run as they do for real, without compiling (a minute) or loading a damaged library."""
    monkeypatch.setenv("LRA_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(_yoso_build, "_loaded", {})
    monkeypatch.setattr(_yoso_build, "_failed", {})
    compiled, imported = [], []

    def compile_(build):
        folder = tmp_path / build.name
        compiled.append(sorted(path.name for path in folder.iterdir()))  # what the compiler starts from
        (folder / f"{build.name}.so").write_bytes(b"rebuilt library " * 64)

    monkeypatch.setattr(_yoso_build, "_compile_in_worker", compile_)
    monkeypatch.setattr(_yoso_build, "_import_built",
                        lambda name, folder: imported.append((folder / f"{name}.so").read_bytes()) or name)
    return tmp_path, compiled, imported


def finished_build(root: Path) -> Path:
    """A finished CPU build as _build_once leaves it: its objects, its library and the stamp recording it."""
    folder = root / CPU.name
    folder.mkdir()
    for name in ("build.flock", "build.ninja", ".ninja_log", "yoso_cpu.o"):
        (folder / name).write_bytes(b"x")
    (folder / f"{CPU.name}.so").write_bytes(b"original library" * 64)
    record = {"name": CPU.name, "library": _yoso_build._library_record(folder / f"{CPU.name}.so")}
    (folder / COMPLETE_STAMP).write_text(json.dumps(record))
    return folder


def test_an_intact_build_is_imported_as_it_is(cache):
    root, compiled, imported = cache
    finished_build(root)
    assert _yoso_build.load("cpu") == CPU.name
    assert compiled == [] and imported == [b"original library" * 64]


def flip_a_byte(library: Path) -> None:
    data = bytearray(library.read_bytes())
    data[100] ^= 1
    library.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, reason", [
    (lambda lib, stamp: lib.write_bytes(lib.read_bytes()[:100]), "is 100 bytes, 1024 when it was built"),
    (lambda lib, stamp: lib.write_bytes(b""), "is 0 bytes, 1024 when it was built"),
    (lambda lib, stamp: flip_a_byte(lib), "no longer has the SHA-256 recorded when it was built"),
    (lambda lib, stamp: lib.unlink(), "cannot be read: No such file or directory"),
    (lambda lib, stamp: stamp.write_text('{"name": "x"}'), "an older lra-harness built it"),
    (lambda lib, stamp: stamp.write_text("{trunc"), f"its {COMPLETE_STAMP} cannot be read"),
])
def test_a_damaged_build_is_rebuilt_from_an_empty_folder_before_it_is_loaded(cache, capsys, damage, reason):
    root, compiled, imported = cache
    folder = finished_build(root)
    damage(folder / f"{CPU.name}.so", folder / COMPLETE_STAMP)
    assert _yoso_build.load("cpu") == CPU.name
    assert imported == [b"rebuilt library " * 64], "only the rebuilt library is loaded"
    assert compiled == [["build.flock"]], "the rebuild starts from an empty folder (stale objects would be relinked)"
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and line.startswith(f"the YOSO CPU kernels in {folder} cannot be used"), line
    assert reason in line and line.endswith("rebuilding them")
    assert _yoso_build._damage(folder, CPU.name) is None  # the new stamp records the new library


def test_a_damaged_build_that_cannot_be_rewritten_names_the_folder_to_delete(cache, monkeypatch):
    root, compiled, _ = cache
    folder = finished_build(root)
    (folder / f"{CPU.name}.so").write_bytes(b"")

    @contextlib.contextmanager
    def read_only(build_directory):
        raise PermissionError(errno.EACCES, "Permission denied")
        yield

    monkeypatch.setattr(_yoso_build, "_exclusive_build", read_only)
    with pytest.raises(KernelUnavailable) as raised:
        _yoso_build.load("cpu")
    message = str(raised.value)
    assert message.startswith(f"the YOSO CPU kernels in {folder} are damaged ({CPU.name}.so is 0 bytes, ") and \
        "cannot be rebuilt there (Permission denied): delete that folder" in message and compiled == []


def test_force_rebuilds_an_intact_build(cache, monkeypatch, capsys):
    root, compiled, imported = cache
    folder = finished_build(root)
    monkeypatch.setattr(_yoso_build, "_import_built", lambda name, folder: imported.append(
        (folder / f"{name}.so").read_bytes()) or SimpleNamespace(__file__=str(folder / f"{name}.so")))
    _yoso_build.main(["cpu"])
    assert compiled == [] and "compiling" not in capsys.readouterr().out
    _yoso_build.main(["cpu", "--force"])
    assert compiled == [["build.flock"]] and imported[-1] == b"rebuilt library " * 64
    assert "cpu: compiling the YOSO kernels" in capsys.readouterr().out
    assert _yoso_build._damage(folder, CPU.name) is None


@needs_kernels
def test_a_truncated_real_library_is_caught_before_it_is_loaded(tmp_path):
    """The suite's own CPU build, copied and truncated: loading it was a SIGBUS. The check reads the
    stamp, not the library's code, so this process survives it."""
    built = Path(_yoso_build.load("cpu").__file__).parent
    copy = shutil.copytree(built, tmp_path / built.name)
    assert _yoso_build._damage(copy, built.name) is None
    library = copy / f"{built.name}.so"
    size = library.stat().st_size
    with open(library, "r+b") as handle:
        handle.truncate(size // 2)
    assert _yoso_build._import_checked(built.name, copy) == (None, f"{library.name} is {size // 2} bytes, "
                                                                    f"{size} when it was built")


def test_a_torch_without_cuda_says_so_before_anything_else(monkeypatch, capsys):
    monkeypatch.setattr(_yoso_build, "_failed", {})
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(_yoso_build, "nvcc_release", lambda: pytest.fail("nvcc was looked for"))
    for arch_list in ("junk", ""):
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
        with pytest.raises(SystemExit) as exited:
            _yoso_build.main(["cuda"])
        assert exited.value.code == 1
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: this torch (") and len(err.splitlines()) == 1, err
        assert "has no CUDA support (torch.version.cuda is None): install a CUDA build of torch" in err


@pytest.mark.parametrize("kind, environment, output, named", [
    ("cuda", {"TORCH_CUDA_ARCH_LIST": "8.0 junk"}, "Traceback...\nlra-yoso-build-failed: ValueError: Unknown CUDA "
     "arch (junk) or GPU not supported\n", "TORCH_CUDA_ARCH_LIST='8.0 junk' is not a list of GPU architectures"),
    ("cuda", {"CUDA_HOME": "/opt/cuda"}, "nvcc fatal   : Value 'c++99' is not defined\n", "CUDA_HOME=/opt/cuda has"),
    ("cpu", {"CXX": "g++-9", "LRA_KERNEL_CPU_ARCH": "x86-64-v3"},
     "[1/3] c++ -c a.cpp\nx.cpp:3:1: error: 'foo' was not declared\nmore\n",
     "failed: x.cpp:3:1: error: 'foo' was not declared; fix the C++ compiler (with OpenMP) or these settings: "
     "LRA_KERNEL_CPU_ARCH=x86-64-v3, CXX=g++-9"),
])
def test_a_failed_build_names_the_setting_to_fix(monkeypatch, kind, environment, output, named):
    for name in ("CXX", "LRA_KERNEL_CPU_ARCH", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    line = _yoso_build._explain_failure(kind, output, "/c/build.log")
    assert line.startswith(f"building the YOSO {kind.upper()} kernels failed: ") and named in line, line
    assert line.endswith("(full output: /c/build.log)") and "\n" not in line


def test_the_build_output_goes_to_a_log_and_to_stderr_only_when_verbose(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LRA_KERNEL_CACHE", str(tmp_path))
    (tmp_path / CPU.name).mkdir()

    class Worker:
        returncode, pid = 1, 0

        def __init__(self, argv, **options):
            pass

        def communicate(self):
            return "ninja: compiling\nx.cpp:1:1: error: no\nninja: build stopped\n", None

    monkeypatch.setattr(_yoso_build.subprocess, "Popen", Worker)
    log = tmp_path / CPU.name / "build.log"
    for verbose in ("0", "1"):
        monkeypatch.setenv("LRA_KERNEL_VERBOSE", verbose)
        with pytest.raises(KernelUnavailable, match="failed: x.cpp:1:1: error: no; ") as raised:
            _yoso_build._compile_in_worker(CPU)
        assert str(raised.value).endswith(f"(full output: {log})") and "ninja: build stopped" in log.read_text()
        assert ("ninja: compiling" in capsys.readouterr().err) is (verbose == "1")


LRA_TRAIN = ["lra-train", "trainer=smoke", "trainer.max_steps=2", *SMALL_LISTOPS, "attention=yoso", "attention.impl=cpu"]


def one_error_line(result) -> str:
    """A command that failed with exit 1 and wrote one line to stderr, ``error:`` and no traceback."""
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, (result.returncode, result.stderr)
    line = result.stderr.strip()
    assert line.startswith("error: ") and len(line) < 600, line
    return line


@needs_kernels
def test_a_cpu_arch_the_compiler_rejects_is_one_line_naming_it_and_the_log(tmp_path, data_dir):
    result = run_command(["lra-build-kernels", "cpu"], tmp_path, data_dir, check=False,
                         env_extra={"LRA_KERNEL_CACHE": str(tmp_path / "kc"), "LRA_KERNEL_CPU_ARCH": "junk"})
    line = one_error_line(result)
    log = Path(line.rsplit("(full output: ", 1)[1].rstrip(")"))
    first_error = next(text.strip() for text in log.read_text().splitlines() if "error:" in text)
    assert first_error in line and "LRA_KERNEL_CPU_ARCH=junk" in line, line
    assert "-march=junk" in log.read_text() and not list((tmp_path / "kc").rglob(COMPLETE_STAMP))


@needs_kernels
def test_a_cxx_that_does_not_run_is_one_line_naming_cxx_in_lra_train(tmp_path, data_dir):
    result = run_command(LRA_TRAIN, tmp_path, data_dir, check=False,
                         env_extra={"LRA_KERNEL_CACHE": str(tmp_path / "kc"), "CXX": "/bin/false"})
    line = one_error_line(result)
    assert "/bin/false" in line and "exited with status 1" in line, line
    assert "CXX=/bin/false does not work as a C++ compiler" in line and "(full output: " in line
