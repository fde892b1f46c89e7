"""Backends of your own, outside this package: ``LRA_ATTENTION_MODULES`` names the modules that register
them, imported with the built-in backends. Each entry, comma-separated, is a module path
(``mylab.attention``, importable from the working folder or an installed package) or a ``.py`` file
(``~/attn/my_attention.py``). A module that cannot be imported is one line, naming it, where it failed
and the fix (:class:`UserModuleError`), raised by the next ``build``, ``spec`` or ``make_options``
and by the harness's commands before they start: a backend silently missing from a sweep would be
worse. A file named twice (or also as a module path) is imported once; two files of one name are refused."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Dict, List, Optional, Set

VARIABLE = "LRA_ATTENTION_MODULES"
_PACKAGE = str(Path(__file__).resolve().parent)
_IMPORTED: Set[Path] = set()  # each file imported here (resolved): a file named again is not rerun
_DIGESTS: Dict[Path, str] = {}  # the SHA-256 of each such file as it was imported: the code this process runs
_FAILURE: List["UserModuleError"] = []  # the import's failure, kept for the next use (:func:`check`)


class UserModuleError(ImportError):
    """A module named in ``LRA_ATTENTION_MODULES`` that could not be imported: one line naming it and the fix."""


def entries(value: Optional[str]) -> List[str]:
    return [entry.strip() for entry in (value or "").split(",") if entry.strip()]


def _from_file(entry: str) -> None:
    path = Path(entry).expanduser().resolve()
    if not path.is_file():
        colons = " (entries are separated by commas, not colons)" if os.pathsep in entry else ""
        raise UserModuleError(f"{VARIABLE}: {entry} is not a file{colons}; name a .py file that registers your backend, "
                              "or a module path such as mylab.attention")
    if path in _IMPORTED:  # named twice, or also as a module path
        return
    module_name = f"attention_zoo_user_{path.stem}"
    if module_name in sys.modules:  # another file of this name: imported as this module, it would replace the first
        other = getattr(sys.modules[module_name], "__file__", None) or module_name
        raise UserModuleError(f"{VARIABLE}: {entry} has the file name of {other}, imported before it (both would be "
                              f"module {module_name}): rename one of them")
    _DIGESTS[path] = _sha256(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    _IMPORTED.add(path)


def _from_module(entry: str) -> None:
    """A module path, importable from the working folder as under ``python -m`` (a console script such as
    lra-train has only its own folder on sys.path)."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    spec = importlib.util.find_spec(entry)
    origin = Path(spec.origin).resolve() if spec is not None and spec.has_location and spec.origin else None
    if origin is not None and origin in _IMPORTED:  # named before as a file
        return
    digest = _sha256(origin) if origin is not None else None
    importlib.import_module(entry)
    if origin is not None:
        _IMPORTED.add(origin)
        if digest is not None:
            _DIGESTS.setdefault(origin, digest)


def _sha256(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _where(exc: BaseException, entry: str = "") -> str:
    """Where in the user's code the import failed: the innermost frame in the file named (``entry``), else the
    innermost one outside the import machinery."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if "importlib" not in frame.filename]
    named = Path(entry).expanduser().resolve() if entry.endswith(".py") else None
    in_file = [frame for frame in frames if named is not None and Path(frame.filename).resolve() == named]
    if in_file and not isinstance(exc, SyntaxError):
        return f" ({named.name}, line {in_file[-1].lineno})"
    yours = [frame for frame in frames if not frame.filename.startswith(_PACKAGE + os.sep)]  # not register()'s line
    frames = yours or [frame for frame in frames if not frame.filename.endswith("user_modules.py")]
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({Path(exc.filename).name}, line {exc.lineno})"
    return f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""


def import_all(value: Optional[str]) -> None:
    """Import every entry of ``value`` (the variable's text); the first that fails raises :class:`UserModuleError`."""
    for entry in entries(value):
        try:
            if entry.endswith(".py") or os.sep in entry:
                _from_file(entry)
            else:
                _from_module(entry)
        except UserModuleError:
            raise
        except SystemExit as exc:  # argparse at import, sys.exit(): the command would end without a word
            raise UserModuleError(f"{VARIABLE}: {entry} exited while it was imported (SystemExit {exc.code!r}"
                                  f"{_where(exc, entry)}): a module that registers backends must not parse the command "
                                  f"line or exit at import; fix it, or take it out of {VARIABLE}") from None
        except Exception as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else "no message"
            raise UserModuleError(f"{VARIABLE}: {entry} failed to import: {type(exc).__name__}: {message}"
                                  f"{_where(exc, entry)}; fix it, or take it out of {VARIABLE}") from exc


def load() -> None:
    """Import the modules the variable names now; a failure is kept, raised by :func:`check`."""
    _FAILURE.clear()
    try:
        import_all(os.environ.get(VARIABLE))
    except UserModuleError as exc:
        _FAILURE.append(exc)


def check() -> None:
    """Raise the :class:`UserModuleError` of :func:`load`, if its import failed (the next ``build``, ``spec``
    or ``make_options``, and the harness's commands before they start)."""
    if _FAILURE:
        raise _FAILURE[0]


def source_of(cls: type) -> Optional[Dict[str, str]]:
    """``{"file", "sha256"}``: the file that defines ``cls`` and the digest of its bytes as imported, for a backend
    outside this package (a backend of yours: the harness's git commit does not name its code; what that file
    imports is not covered); None for a built-in backend, or where the class has no file that can be read."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if not path:
        return None
    path = Path(path).resolve()
    if str(path).startswith(_PACKAGE + os.sep):
        return None
    digest = _DIGESTS.get(path) or _sha256(path)  # as imported: an edit since does not run here
    return {"file": str(path), "sha256": digest} if digest else None


def culprit(exc: BaseException) -> Optional[str]:
    """``"<file>, line <n>"`` (or the file alone) where ``exc`` comes from the code of a backend of yours: a
    contract :class:`~attention_zoo.registry.BackendError` of one of your classes, or an error whose innermost
    frame in your files or this package (libraries such as torch passed over) is in one of your files. None
    where it is the package's own, or no file of yours is involved."""
    backend = getattr(exc, "backend", None)
    if isinstance(backend, type):
        source = source_of(backend)
        return source["file"] if source else None
    yours = {str(path) for path in _IMPORTED}
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = str(Path(frame.filename).resolve()) if frame.filename and not frame.filename.startswith("<") else ""
        if path in yours:
            return f"{path}, line {frame.lineno}"
        if path.startswith(_PACKAGE + os.sep) or path.startswith(str(Path(_PACKAGE).parent / "lra") + os.sep):
            return None
    return None
