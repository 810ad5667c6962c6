"""Build hook: compile the C preload tracer with the system C compiler.

The shim is not a Python extension module, but building it as an `Extension` makes
`pip install .`, `pip install -e .` and wheel builds all compile it with no manual
step; the only twist is the file name (no ABI tag: it is loaded by LD_PRELOAD).
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PRELOAD = "roar_core._bin.libroar_preload"


class BuildPreload(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        # Called with the dotted full name or just its last part; mirror both forms.
        parts = fullname.split(".")
        if parts[-1] == PRELOAD.rsplit(".", 1)[-1]:
            return os.path.join(*parts[:-1], parts[-1] + ".so")
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        # Not a Python module: there is no PyInit_ symbol to export.
        return [] if ext.name == PRELOAD else super().get_export_symbols(ext)


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
    cmdclass={"build_ext": BuildPreload},
)
