"""What a run ran on: the machine and the Python environment, taken once per process.

Both are facts of the process that records (the recorder, or the worker that takes a task's
versions): the engines' tasks run in the same environment on the same host.  Each set of
facts is identified by the blake3 of its canonical JSON; the store keeps each once
(`provenance_facts`) and a task run names its two (`task_runs.environment`), while events
carry the small facets (`roar_machine`, `roar_environment`): the package list stays in the
store.  Nothing here fails a run: a fact that cannot be read is left out.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, NamedTuple

from roar_core.ids import host_name

NVIDIA_SMI_TIMEOUT_S = 10


class Facts(NamedTuple):
    kind: str  # "machine" | "environment"
    digest: str  # blake3:<hex> of `data` as canonical JSON
    data: dict[str, Any]  # all of it, for the store
    facet: dict[str, Any]  # what events carry


def _digest(data: dict[str, Any]) -> str:
    import blake3

    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "blake3:" + blake3.blake3(text.encode()).hexdigest()


@functools.cache
def machine() -> Facts:
    data: dict[str, Any] = {"host": host_name(), "cores": os.cpu_count() or 0}
    cpu = _first("/proc/cpuinfo", "model name")
    if cpu:
        data["cpuModel"] = cpu
    mem = _first("/proc/meminfo", "MemTotal")
    if mem and mem.split()[0].isdigit():
        data["memoryBytes"] = int(mem.split()[0]) * 1024
    try:
        nodes = [n for n in os.listdir("/sys/devices/system/node")
                 if n.startswith("node") and n[4:].isdigit()]
        data["numaNodes"] = len(nodes)
    except OSError:
        pass
    gpus, topology = _gpus()
    if gpus:
        data["gpus"] = gpus
    if topology:
        data["gpuTopology"] = topology
    return Facts("machine", _digest(data), data, data)


def _first(path: str, key: str) -> str | None:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def _gpus() -> tuple[list[dict[str, Any]], str | None]:
    """NVIDIA GPUs (name, driver, memory, bus) and `nvidia-smi topo -m`; none without it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], None
    fields = "name,driver_version,memory.total,pci.bus_id"
    try:
        out = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
        topo = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True,
                              timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return [], None
    gpus = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        gpu: dict[str, Any] = {"name": parts[0], "driver": parts[1], "busId": parts[3]}
        if parts[2].isdigit():
            gpu["memoryMiB"] = int(parts[2])
        gpus.append(gpu)
    topology = topo.stdout.strip() if topo.returncode == 0 and gpus else None
    return gpus, topology or None


_environment: tuple[tuple, Facts] | None = None
_checked_at = 0.0
RECHECK_S = 1.0


def environment() -> Facts:
    """The environment's facts, taken again when one of its site-packages directories has
    changed (a pip install or uninstall changes it), looked at once a second at most: a
    long-lived recorder, or the fork server recorders start from, does not go on reporting
    a package set that is gone."""
    global _environment, _checked_at
    now = time.monotonic()
    if _environment is not None and now - _checked_at < RECHECK_S:
        return _environment[1]
    _checked_at = now
    key = tuple(_mtime(p) for p in site_dirs())
    if _environment is None or _environment[0] != key:
        _environment = key, _take_environment()
    return _environment[1]


def site_dirs() -> list[str]:
    """Where the environment's packages are installed: its site-packages (and the user's,
    where the interpreter reads it), not the whole import path, which a process's working
    directory and PYTHONPATH change (a recorder started by another test, or from another
    directory, saw the base interpreter's packages through them)."""
    import site

    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.USER_SITE and os.path.isdir(site.USER_SITE):
        dirs.append(site.USER_SITE)
    return dirs


def _mtime(path: str) -> int:
    try:
        return os.stat(path or ".").st_mtime_ns
    except OSError:
        return 0


def installed(where: list[str]) -> list[str]:
    """`Name==Version` of each distribution installed in `where`, as importlib.metadata
    names them (its `metadata["Name"]` and `version`), sorted."""
    from importlib import metadata

    found = set()
    for d in metadata.distributions(path=where):
        name, version = _name_version(d.read_text("METADATA") or d.read_text("PKG-INFO") or "")
        if name:
            found.add(f"{name}=={version}")
    return sorted(found, key=str.lower)


# A header line, as the email parser tells one (its `headerRE`): anything else ends them.
_HEADER = re.compile(r"[\041-\071\073-\176]*:")


def _name_version(text: str) -> tuple[str | None, str | None]:
    """The first Name and Version headers of a metadata file, as importlib.metadata's email
    parser reads them (a folded one, which no packager writes: its first line).  Not
    through `Distribution.metadata`: that parser reads each file whole, long descriptions
    included (254 packages: 255-400 ms of a recorder's CPU, 16-31 ms so), and a recorder not
    forked from a warm server (the first after a boot or an idle spell) takes them."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    found: dict[str, str] = {}
    end = text.find("\n\n")  # (a long description's lines not split)
    for line in (text if end < 0 else text[:end]).split("\n"):
        if line[:1] in (" ", "\t") or line.startswith("From "):  # folded; an mbox envelope
            continue
        if not line or not _HEADER.match(line):  # the headers' end: the body may hold anything
            break
        key, _, value = line.partition(":")
        found.setdefault(key.lower(), value.lstrip(" \t"))
        if "name" in found and "version" in found:  # (the first of each is the one)
            break
    return found.get("name"), found.get("version")


def _take_environment() -> Facts:
    packages = installed(site_dirs())
    data: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": sys.implementation.name,
        "executable": sys.executable,
        "packages": packages,
    }
    image = _container_image()
    if image:
        data["containerImage"] = image
    digest = _digest(data)
    facet = {k: v for k, v in data.items() if k != "packages"}
    facet["packageCount"] = len(packages)
    facet["packagesDigest"] = _digest({"packages": packages})
    return Facts("environment", digest, data, facet)


def _container_image() -> str | None:
    """The image of the container this runs in, where the runtime says (podman, OCI env)."""
    for var in ("CONTAINER_IMAGE", "OCI_IMAGE", "IMAGE_ID"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        with open("/run/.containerenv") as f:  # podman
            for line in f:
                k, _, v = line.partition("=")
                if k.strip() in ("imageid", "image") and v.strip().strip('"'):
                    return v.strip().strip('"')
    except OSError:
        pass
    return None
