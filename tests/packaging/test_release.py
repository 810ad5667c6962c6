"""The release artifacts of packaging/build-wheels.sh, as a user gets them: wheels that
install and trace with no compiler anywhere, an sdist that says in one line what it lacks.

The wheels are built once, before the tests (`.ci/run` builds them into a directory named
by ROAR_TEST_WHEELS); without it these tests skip, or fail under ROAR_TEST_REQUIRE_WHEELS=1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import blake3
import pytest

ROOT = Path(__file__).resolve().parents[2]
NEEDS_CC = "roar-core: building the tracer needs a C compiler"


@pytest.fixture(scope="module")
def artifacts() -> Path:
    d = os.environ.get("ROAR_TEST_WHEELS")
    if d and list(Path(d).glob("*.whl")):
        return Path(d)
    why = f"no wheels in ROAR_TEST_WHEELS={d!r} (packaging/build-wheels.sh DIR makes them)"
    if os.environ.get("ROAR_TEST_REQUIRE_WHEELS") == "1":
        pytest.fail(f"release wheels required (ROAR_TEST_REQUIRE_WHEELS=1): {why}")
    pytest.skip(why)


def _wheel(artifacts: Path, arch: str) -> Path:
    found = list(artifacts.glob(f"roar_core-*-py3-none-manylinux_2_17_{arch}.whl"))
    assert len(found) == 1, f"{arch}: {sorted(p.name for p in artifacts.iterdir())}"
    return found[0]


def _sdist(artifacts: Path) -> Path:
    (found,) = artifacts.glob("roar_core-*.tar.gz")
    return found


def _readelf(path: Path, *flags: str) -> str:
    return subprocess.run(["readelf", "-W", *flags, str(path)], capture_output=True,
                          text=True, check=True).stdout


def _bare_path(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only these programs: no compiler, no cargo can be found on it."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for t in tools:
        src = Path(t) if os.path.isabs(t) else Path("/usr/bin", t)
        (d / src.name).symlink_to(src)
    return str(d)


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where / "bin"


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_wheel_holds_stripped_libraries_for_glibc_2_17_without_runpath(artifacts, arch,
                                                                       tmp_path):
    if arch != "x86_64" and not list(artifacts.glob(f"*_{arch}.whl")):
        pytest.skip(f"no {arch} wheel was built (the script says why)")
    whl = _wheel(artifacts, arch)
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        z.extractall(tmp_path)
        wheel_meta = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        assert f"Tag: py3-none-manylinux_2_17_{arch}" in z.read(wheel_meta).decode()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "roar_core_s3.pth" in names  # site-packages' top level, where a .pth runs
    libs = sorted(n for n in names if n.endswith(".so"))
    assert libs == ["roar_core/_bin/libroar_hashbatch.so", "roar_core/_bin/libroar_preload.so"]
    machine = {"x86_64": "X86-64", "aarch64": "AArch64"}[arch]
    for lib in libs:
        path = tmp_path / lib
        header = _readelf(path, "-h")
        assert machine in header, lib
        dynamic = _readelf(path, "-d")
        assert "RPATH" not in dynamic and "RUNPATH" not in dynamic, (lib, dynamic)
        assert ".symtab" not in _readelf(path, "-S"), f"{lib} is not stripped"
        versions = {tuple(map(int, v.split("."))) for v in
                    re.findall(r"@GLIBC_([0-9.]+)", _readelf(path, "--dyn-syms"))}
        assert versions and max(versions) <= (2, 17), (lib, sorted(versions)[-3:])


def test_wheel_installs_with_no_compiler_and_traces(artifacts, tmp_path):
    venv = _venv(tmp_path / "venv")
    # pip with nothing else on PATH: were anything to be compiled, it would fail here.
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "ROAR_HOME")}
    env["PATH"] = str(venv)
    inst = subprocess.run([str(venv / "pip"), "install", "-q", "--disable-pip-version-check",
                           "--only-binary", ":all:", str(_wheel(artifacts, "x86_64"))],
                          env=env, capture_output=True, text=True)
    assert inst.returncode == 0, inst.stderr[-3000:]

    work = tmp_path / "work"
    work.mkdir()
    (work / "in.txt").write_bytes(b"bytes from a prebuilt tracer\n")
    env["PATH"] = _bare_path(tmp_path, "cp") + os.pathsep + str(venv)
    env["ROAR_HOME"] = str(work / ".roar")
    doctor = subprocess.run([str(venv / "roar-core"), "doctor"], cwd=work, env=env,
                            capture_output=True, text=True)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    rows = dict(line.split(None, 2)[:2] for line in doctor.stdout.splitlines() if line.strip())
    assert set(rows.values()) == {"ok"}, doctor.stdout
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    assert str(site / "roar_core" / "_bin" / "libroar_preload.so") in doctor.stdout
    assert "native batch hasher" in doctor.stdout
    # The S3 tracer starts in traced Python processes only (its .pth, from the wheel).
    watching = "import sys; print(any(type(f).__name__ == '_Watch' for f in sys.meta_path))"
    for session, expect in ((None, "False"), (str(tmp_path), "True")):
        penv = {**env, **({"ROAR_SESSION_DIR": session} if session else {})}
        out = subprocess.run([str(venv / "python"), "-c", watching], env=penv,
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expect, (session, out.stdout, out.stderr)

    run = subprocess.run([str(venv / "roar-core"), "run", "--wait", "--", "cp", "in.txt",
                          "out.txt"], cwd=work, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lineage = subprocess.run([str(venv / "roar-core"), "lineage", "out.txt", "--json"],
                             cwd=work, env=env, capture_output=True, text=True, check=True)
    digest = blake3.blake3((work / "out.txt").read_bytes()).hexdigest()
    assert f"blake3:{digest}" in lineage.stdout
    assert str(work / "in.txt") in lineage.stdout


def test_sdist_without_c_compiler_stops_with_one_line(artifacts, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    env["PATH"] = _bare_path(tmp_path, sys.executable)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                            "--disable-pip-version-check", "-w", str(tmp_path / "out"),
                            str(_sdist(artifacts))], env=env, capture_output=True, text=True)
    assert build.returncode != 0
    said = [line.strip() for line in (build.stdout + build.stderr).splitlines()
            if NEEDS_CC in line]
    assert said, build.stdout[-2000:] + build.stderr[-2000:]
    assert "apt install gcc" in said[0]
    assert "No such file or directory" not in build.stdout + build.stderr


def test_sdist_without_cargo_builds_and_says_what_is_slower(artifacts, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CARGO_HOME", "RUSTUP_HOME")}
    env.update(HOME=str(home), CARGO_HOME=str(home / "no-cargo"),
               PATH=_bare_path(tmp_path, sys.executable, "gcc", "cc", "as", "ld"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v",
                            "--disable-pip-version-check", "-w", str(tmp_path / "out"),
                            str(_sdist(artifacts))], env=env, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    warned = [line for line in (build.stdout + build.stderr).splitlines()
              if "cargo not found" in line]
    assert len(warned) == 1 and "hashes small files in Python" in warned[0], warned
    (whl,) = (tmp_path / "out").glob("roar_core-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "roar_core/_bin/libroar_preload.so" in names
    assert "roar_core/_bin/libroar_hashbatch.so" not in names

    # pip shows none of that (no -v): the first run says it, once.
    venv = _venv(tmp_path / "venv")
    subprocess.run([str(venv / "pip"), "install", "-q", "--disable-pip-version-check",
                    str(whl)], check=True, capture_output=True)
    work = tmp_path / "work"
    work.mkdir()
    env = {**env, "PATH": f"{venv}{os.pathsep}/usr/bin:/bin", "ROAR_HOME": str(work / "h"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    said = []
    for _ in range(2):
        run = subprocess.run([str(venv / "roar-core"), "run", "--", "true"], cwd=work,
                             env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        said.append("no native batch hasher" in run.stderr)
    assert said == [True, False]
