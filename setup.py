"""Build hook: compile the C preload tracer with the system C compiler, and the batch
hasher (Rust, tracer-bins/hashbatch) with cargo; or, for release wheels, take both
prebuilt for an old glibc from ROAR_PREBUILT (see packaging/build-wheels.sh).

Neither library is a Python extension module: the shim is loaded by LD_PRELOAD into every
traced program, the hasher with ctypes.  Declaring the shim as an `Extension` only makes
`pip install .`, `pip install -e .` and wheel builds all run this hook with no manual
step; the shim is compiled here with one plain compiler call, so it carries no RUNPATH of
the build machine's Python (setuptools' link line adds one) into the programs it traces.
The wheel is tagged `py3-none-<platform>`: it fits every Python this package supports.
The batch hasher is optional: without cargo, or if its build fails, roar hashes in Python
(slower for many small files) and `roar-core doctor` says so.
"""

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PRELOAD = "roar_core._bin.libroar_preload"
PRELOAD_SRC = Path("tracer-bins", "preload", "roar_preload.c")
HASHBATCH = Path("tracer-bins", "hashbatch")
HASHBATCH_LIB = "libroar_hashbatch.so"
# The shim's flags; packaging/build-wheels.sh compiles it with the same ones.
CFLAGS = ["-O2", "-std=gnu11", "-fPIC", "-fvisibility=hidden", "-fno-strict-aliasing",
          "-Wall", "-Wextra", "-Wno-unused-parameter"]
LDFLAGS = ["-shared", "-s", "-ldl", "-pthread"]
# Starts the S3 tracer in traced Python processes (and does nothing in the others): a .pth
# runs at interpreter start only from site-packages' top level, beside the packages.
S3_PTH = "roar_core_s3.pth"


def _cargo() -> str | None:
    home = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
    return shutil.which("cargo") or shutil.which("cargo", path=os.path.join(home, "bin"))


def _c_compiler() -> list[str]:
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc") or ["cc"]
    if shutil.which(cc[0]) is None:
        sys.exit(f"roar-core: building the tracer needs a C compiler, and `{cc[0]}` "
                 "is not installed: install gcc (Debian/Ubuntu: apt install gcc libc6-dev) "
                 "or set CC, or install a prebuilt roar-core wheel")
    return cc


class BuildNative(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        # Called with the dotted full name or just its last part; mirror both forms.
        parts = fullname.split(".")
        if parts[-1] == PRELOAD.rsplit(".", 1)[-1]:
            return os.path.join(*parts[:-1], parts[-1] + ".so")
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        prebuilt = os.environ.get("ROAR_PREBUILT")
        if prebuilt:
            shutil.copyfile(Path(prebuilt, out.name), out)
            return
        cmd = [*_c_compiler(), *CFLAGS, f"-I{PRELOAD_SRC.parent}", str(PRELOAD_SRC),
               "-o", str(out), *LDFLAGS]
        print(" ".join(cmd))
        if subprocess.run(cmd).returncode != 0:
            sys.exit(f"roar-core: compiling the tracer ({PRELOAD_SRC}) failed; see above")

    def run(self) -> None:
        super().run()
        self._build_hashbatch()

    def _build_hashbatch(self) -> None:
        dest = Path("roar_core", "_bin") if self.inplace else Path(
            self.build_lib, "roar_core", "_bin")
        dest.mkdir(parents=True, exist_ok=True)
        prebuilt = os.environ.get("ROAR_PREBUILT")
        if prebuilt:
            shutil.copyfile(Path(prebuilt, HASHBATCH_LIB), dest / HASHBATCH_LIB)
            return
        cargo = _cargo()
        if cargo is None:
            print("roar-core: warning: cargo not found: built without the native batch "
                  "hasher, so roar hashes small files in Python (slower; `roar-core doctor` "
                  "says so). Install Rust (https://rustup.rs) and reinstall to have it.",
                  file=sys.stderr)
            return
        target = Path(self.build_temp).resolve() / "cargo"
        cmd = [cargo, "build", "--release", "--locked", "--manifest-path",
               str(HASHBATCH / "Cargo.toml"), "--target-dir", str(target)]
        if subprocess.run(cmd).returncode != 0:
            print("roar-core: warning: building tracer-bins/hashbatch failed: roar hashes "
                  "small files in Python (slower)", file=sys.stderr)
            return
        shutil.copyfile(target / "release" / HASHBATCH_LIB, dest / HASHBATCH_LIB)


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(S3_PTH, os.path.join(self.build_lib, S3_PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, S3_PTH)]


class EditableWheel(editable_wheel):
    # An editable install links the packages, not build_py's outputs: the .pth goes into
    # the wheel it builds by hand (setuptools writes that directory into the wheel).
    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
        out = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copyfile(S3_PTH, os.path.join(unpacked_wheel, S3_PTH))
        return out


class Wheel(bdist_wheel):
    def finalize_options(self) -> None:
        # ROAR_PREBUILT's libraries may be for another architecture than this machine's.
        self.plat_name = os.environ.get("ROAR_PREBUILT_PLATFORM") or self.plat_name
        super().finalize_options()

    def get_tag(self) -> tuple[str, str, str]:
        # Platform-specific (native libraries), but not tied to a Python version or ABI.
        return ("py3", "none", super().get_tag()[2])


setup(
    ext_modules=[Extension(PRELOAD, sources=[str(PRELOAD_SRC)])],
    cmdclass={"build_ext": BuildNative, "build_py": BuildPy,
              "editable_wheel": EditableWheel, "bdist_wheel": Wheel},
)
