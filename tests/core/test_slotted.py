"""The value classes of `roar-core run`'s path (roar_core.slotted) behave as the dataclasses
they replaced: equality, hashing, immutability, `replace`, pickling; and that path imports
none of the modules they were made to avoid."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from roar_core import config
from roar_core.pipeline.tracelog import LogHeader, Record

ROAR = Path(sys.executable).with_name("roar-core")


def _record(**changes) -> Record:
    fields = dict(op=1, pid=2, ppid=1, tid=2, result=3, err=0, flags=0, mode=0, fd=3,
                  rflags=0, mono_ns=10, wall_ns=20, st_dev=1, st_ino=2, st_size=3,
                  st_mtime_ns=4, st_ctime_ns=5, tag="t", path=b"/a", path2=b"")
    fields.update(changes)
    return Record(**fields)


def test_config_is_frozen_hashable_and_compares_without_its_root(tmp_path: Path) -> None:
    cfg = config.load(cwd=tmp_path, env={})
    with pytest.raises(AttributeError):
        cfg.home = tmp_path  # type: ignore[misc]
    moved = cfg.replace(project_root=Path("/elsewhere"))
    assert moved == cfg and hash(moved) == hash(cfg)  # project_root: compare=False
    other = cfg.replace(namespace="other")
    assert other != cfg and other.namespace == "other" and cfg.namespace == "roar"
    assert {cfg, moved, other} == {cfg, other}
    with pytest.raises(TypeError, match="no field 'nope'"):
        cfg.replace(nope=1)


def test_config_keys_and_their_types_come_from_its_fields(tmp_path: Path) -> None:
    assert "project_root" not in config.KEYS
    assert set(config.KEYS) == set(config.Config.fields()) - {"project_root"}
    cfg = config.load(cwd=tmp_path, env={"ROAR_HASH_WORKERS": "3", "ROAR_EMIT": "no",
                                         "ROAR_EXCLUDE": "a:b"})
    assert (cfg.hash_workers, cfg.emit, cfg.exclude) == (3, False, ("a", "b"))


def test_pickled_and_copied_values_are_equal(tmp_path: Path) -> None:
    cfg = config.load(cwd=tmp_path, env={})
    header = LogHeader(1, 0, 2, 1, 10, 20, 4096, 0, 0)
    rec = _record()
    for value in (cfg, header, rec):
        for back in (pickle.loads(pickle.dumps(value)), copy.copy(value),
                     copy.deepcopy(value)):
            assert back == value and type(back) is type(value)
    assert pickle.loads(pickle.dumps(cfg)).project_root == cfg.project_root


def test_records_compare_by_value_and_replace_makes_a_copy() -> None:
    a = _record()
    b = a.replace(path=b"/b")
    assert a == _record() and a != b and (a.path, b.path) == (b"/a", b"/b")
    assert "path=b'/a'" in repr(a)
    with pytest.raises(TypeError):
        hash(a)  # mutable, as a plain @dataclass


def _run_modules(tmp_path: Path, *argv: str, options: tuple[str, ...] = (),
                 blocked: tuple[str, ...] = ()) -> set[str]:
    """The modules loaded by `roar-core run [options] -- argv`, as it exits.  `blocked`:
    modules whose import fails in it (one already imported by the interpreter's start,
    such as an editable install's finder, cannot be told apart otherwise)."""
    script = (  # (a run leaves by os._exit once nothing is left to flush: dumped there too)
        "import atexit, os, sys\n"
        f"sys.modules.update(dict.fromkeys({list(blocked)!r}))\n"
        "out, leave = sys.argv[1], os._exit\n"
        "def dump(): open(out, 'w').write('\\n'.join(sys.modules))\n"
        "atexit.register(dump)\n"
        "os._exit = lambda code: (dump(), leave(code))\n"
        f"sys.argv = ['roar-core', 'run', *{list(options)!r}, '--', *{list(argv)!r}]\n"
        "from roar_core.cli.entry import main\n"
        "main()\n"
    )
    out = tmp_path / "modules.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROAR_")}
    env["ROAR_HOME"] = str(tmp_path / "home")
    proc = subprocess.run([sys.executable, "-c", script, str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(out.read_text().split())


def test_run_path_imports_none_of_the_modules_it_avoids(tmp_path: Path) -> None:
    """Each was measured on `roar-core run`'s start (see roar_core.slotted and the
    modules' comments); an import of one of them there would undo it unnoticed."""
    loaded = _run_modules(tmp_path, "true")
    assert "roar_core.cli.run" in loaded
    avoided = {"dataclasses", "typing", "uuid", "logging", "shutil", "tomllib", "ctypes",
               "inspect", "datetime", "sqlalchemy", "openlineage", "click", "shlex"}
    assert not avoided & loaded, sorted(avoided & loaded)


def test_run_path_takes_its_paths_as_strings(tmp_path: Path) -> None:
    """pathlib, with the urllib.parse it imports, was ~4 ms of `roar-core run true`'s
    ~41 on a wheel install: the run's path (configuration, task log, sessions, tracer,
    recorder hand-off) runs with its import failing."""
    loaded = _run_modules(tmp_path, "true", blocked=("pathlib", "urllib.parse"))
    assert {"roar_core.cli.run", "roar_core.recording.forkserver"} <= loaded


def test_a_run_that_writes_a_file_takes_its_version_without_heavy_imports(
        tmp_path: Path) -> None:
    """The capture (classification, hashing, the stat cache) at the end of a run that
    touched a file: dataclasses, typing, logging, platform and concurrent.futures were
    ~20 ms of each such `roar-core run` (of ~90)."""
    loaded = _run_modules(tmp_path, "sh", "-c", "echo x > f")
    assert {"roar_core.pipeline.capture", "roar_core.pipeline.hashing"} <= loaded
    avoided = {"dataclasses", "typing", "logging", "inspect", "platform",
               "concurrent.futures", "sqlalchemy", "openlineage", "click"}
    assert not avoided & loaded, sorted(avoided & loaded)


def test_a_waited_run_without_a_progress_bar_imports_none(tmp_path: Path) -> None:
    """rich.progress (tables, spinners, fractions: ~8 ms) only where a bar is shown."""
    loaded = _run_modules(tmp_path, "true", options=("--wait",))
    assert "roar_core.cli.wait" in loaded and "rich.console" in loaded
    assert "rich.progress" not in loaded
