"""Build hook: compile the C preload tracer with the system C compiler, and the batch
hasher (Rust, tracer-bins/hashbatch) with cargo.

The shim is not a Python extension module, but building it as an `Extension` makes
`pip install .`, `pip install -e .` and wheel builds all compile it with no manual
step; the only twist is the file name (no ABI tag: it is loaded by LD_PRELOAD).
The batch hasher is optional: without cargo, or if its build fails, roar hashes in
Python (slower for many small files) and `roar-core doctor` says so.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PRELOAD = "roar_core._bin.libroar_preload"
HASHBATCH = Path("tracer-bins", "hashbatch")
HASHBATCH_LIB = "libroar_hashbatch.so"


def _cargo() -> str | None:
    home = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
    return shutil.which("cargo") or shutil.which("cargo", path=os.path.join(home, "bin"))


class BuildNative(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        # Called with the dotted full name or just its last part; mirror both forms.
        parts = fullname.split(".")
        if parts[-1] == PRELOAD.rsplit(".", 1)[-1]:
            return os.path.join(*parts[:-1], parts[-1] + ".so")
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        # Not a Python module: there is no PyInit_ symbol to export.
        return [] if ext.name == PRELOAD else super().get_export_symbols(ext)

    def run(self) -> None:
        super().run()
        self._build_hashbatch()

    def _build_hashbatch(self) -> None:
        cargo = _cargo()
        if cargo is None:
            print("warning: cargo not found; roar will hash small files in Python",
                  file=sys.stderr)
            return
        target = Path(self.build_temp).resolve() / "cargo"
        cmd = [cargo, "build", "--release", "--locked", "--manifest-path",
               str(HASHBATCH / "Cargo.toml"), "--target-dir", str(target)]
        if subprocess.run(cmd).returncode != 0:
            print("warning: building tracer-bins/hashbatch failed; roar will hash small "
                  "files in Python", file=sys.stderr)
            return
        dest = Path("roar_core", "_bin") if self.inplace else Path(
            self.build_lib, "roar_core", "_bin")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target / "release" / HASHBATCH_LIB, dest / HASHBATCH_LIB)


setup(
    ext_modules=[
        Extension(
            PRELOAD,
            sources=["tracer-bins/preload/roar_preload.c"],
            include_dirs=["tracer-bins/preload"],
            extra_compile_args=[
                "-O2", "-std=gnu11", "-fvisibility=hidden", "-fno-strict-aliasing",
                "-Wall", "-Wextra", "-Wno-unused-parameter",
            ],
            extra_link_args=["-ldl", "-pthread"],
        )
    ],
    cmdclass={"build_ext": BuildNative},
)
