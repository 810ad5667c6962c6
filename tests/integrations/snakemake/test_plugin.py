"""The plugin package: cheap to import, never raises, settings as Snakemake wants them."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

from roar_core.pipeline.tracelog import OP, Record
from tests.integrations.snakemake.conftest import BIN, snakemake_env


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=snakemake_env(tmp_path / "home"), timeout=120)


def test_import_is_cheap(tmp_path):
    done = _python("""
        import sys
        import snakemake_executor_plugin_roar as p
        heavy = [m for m in ("roar_core.api", "roar_core.pipeline.store", "sqlalchemy",
                             "openlineage") if m in sys.modules]
        print(p.Executor.__module__, heavy)
    """, tmp_path)
    assert done.stdout.split() == ["snakemake_executor_plugin_roar.executor", "[]"], done.stderr


def test_import_never_raises(tmp_path):
    # A broken dependency must not break Snakemake: a stand-in says what is wrong when used.
    done = _python("""
        import sys
        sys.modules["snakemake.executors.local"] = None  # import fails with ImportError
        import snakemake_executor_plugin_roar as p
        from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry
        ExecutorPluginRegistry().validate_plugin("snakemake_executor_plugin_roar", p)
        try:
            p.Executor(None, None)
        except RuntimeError as e:
            print("refused:", e)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "refused: the roar executor cannot be loaded here (ModuleNotFoundError" in done.stdout


def test_settings_dataclass_booleans_default_false():
    from snakemake_executor_plugin_roar import ExecutorSettings

    fields = {f.name: f for f in dataclasses.fields(ExecutorSettings)}
    assert set(fields) == {"workflow_name", "namespace", "home", "require_tracer", "quiet"}
    for f in fields.values():
        assert f.metadata["help"]
        if f.type is bool:
            assert f.default is False


def test_snakemake_lists_the_roar_options(tmp_path):
    done = subprocess.run([str(BIN / "snakemake"), "--help"], capture_output=True, text=True,
                          env=snakemake_env(tmp_path / "home"), timeout=120)
    for opt in ("--roar-workflow-name", "--roar-namespace", "--roar-home",
                "--roar-require-tracer", "--roar-quiet"):
        assert opt in done.stdout


def _rec(op: str, path: bytes, path2: bytes = b"") -> Record:
    return Record(OP[op], 1, 0, 1, 0, 0, os.O_RDONLY, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, "t",
                  path, path2)


def test_unshadow_names_files_by_their_workdir_path():
    from roar_core.pipeline.attribution import unshadow

    sh = b"/wd/.snakemake/shadow/tmpab12"
    records = [
        _rec("open", sh + b"/in/x.txt"),  # a symlinked input, read in the shadow dir
        _rec("open", sh + b"/out.txt"),  # an output written there
        _rec("rename", sh + b"/out.txt", b"/wd/out.txt"),  # Snakemake moves it out
        _rec("unlink", sh + b"/in/x.txt"),  # and removes the shadow tree
        _rec("open", b"/elsewhere/ref.txt"),
        _rec("exec", b"/bin/cat", b"cat\0/wd/.snakemake/shadow/tmpab12/in/x.txt"),
    ]
    out = unshadow(records, "/wd/.snakemake/shadow", "/wd")
    assert [(r.op_name, r.path, r.path2) for r in out] == [
        ("open", b"/wd/in/x.txt", b""),
        ("open", b"/wd/out.txt", b""),
        ("open", b"/elsewhere/ref.txt", b""),
        ("exec", b"/bin/cat", b"cat\0/wd/.snakemake/shadow/tmpab12/in/x.txt"),
    ]
