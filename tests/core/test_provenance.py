"""The machine and Python environment of a run, against this machine's own account of
itself (/proc, /sys, the installed distributions), read here independently of roar."""

from __future__ import annotations

import json
import os
import socket
import sys
from importlib import metadata
from pathlib import Path

import blake3

from tests.core.test_cli import make_cli
from tests.core.test_exact_lineage import events, run


def _meminfo_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def test_runs_name_their_machine_and_environment(tmp_path) -> None:
    cli = make_cli(tmp_path)
    (cli.cwd / "a.txt").write_text("a\n")
    run_id = run(cli, "copy", "cp a.txt b.txt", wait=True)
    complete = [e for e in events(cli) if e["eventType"] == "COMPLETE"][-1]  # validated

    machine = complete["run"]["facets"]["roar_machine"]
    assert machine["host"] == socket.gethostname()
    assert machine["cores"] == os.cpu_count()
    assert machine["memoryBytes"] == _meminfo_bytes()
    nodes = [n for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit()]
    assert machine["numaNodes"] == len(nodes)
    if not any(Path(d, "nvidia-smi").exists() for d in os.environ["PATH"].split(os.pathsep)):
        assert "gpus" not in machine and "gpuTopology" not in machine  # absent, no error

    env = complete["run"]["facets"]["roar_environment"]
    from roar_core import config
    from roar_core.pipeline.store import Store

    cfg = config.load(cwd=cli.cwd, env=cli.env)
    with Store.open(cfg.database_url, cfg.home) as store:
        named = store.task_run(run_id).environment
        stored = store.facts(named["environment"])["packages"]
        assert store.facts(named["machine"])["host"] == socket.gethostname()
    # The recorder runs in this test's environment (the roar-core next to this Python): the
    # package list it stored is the one this process finds.
    import site

    where = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.USER_SITE and os.path.isdir(site.USER_SITE):
        where.append(site.USER_SITE)
    packages = sorted({f"{d.metadata['Name']}=={d.version}"
                       for d in metadata.distributions(path=where)
                       if d.metadata["Name"]}, key=str.lower)
    assert set(stored) ^ set(packages) == set()
    assert stored == packages
    text = json.dumps({"packages": packages}, sort_keys=True, separators=(",", ":"))
    assert env["packagesDigest"] == "blake3:" + blake3.blake3(text.encode()).hexdigest()
    assert env["packageCount"] == len(packages)
    assert env["python"] == sys.version.split()[0]
    assert "packages" not in env  # the list stays in the store


def test_package_names_are_read_as_importlib_metadata_reads_them(tmp_path) -> None:
    """roar reads only a metadata file's headers; what it names must be what
    importlib.metadata's own (email) parser names, on the files pip leaves and on odd ones."""
    from roar_core.pipeline import provenance

    files = {
        # A long description whose body holds header-like lines.
        "plain-1.0.dist-info/METADATA":
            "Metadata-Version: 2.1\nName: Plain_Pkg\nVersion: 1.0\nSummary: x\n\n"
            + "Name: not-this\nVersion: 9\n" * 500,
        "crlf-2.0.dist-info/METADATA":
            "Metadata-Version: 2.1\r\nname:crlf\r\nVERSION:  2.0  \r\n\r\nName: b",
        "folded-3.dist-info/METADATA": "Name: folded\nSummary: a\n  more\nVersion: 3\n",
        "twice-4.dist-info/METADATA": "Name: first\nName: second\nVersion: 4\nVersion: 5\n",
        "after-5.dist-info/METADATA": "Summary: s\nnot a header\nName: after\nVersion: 5\n",
        "envelope-6.dist-info/METADATA": "From x\nName: envelope\nVersion: 6\n",
        "noname-7.dist-info/METADATA": "Version: 7\n",
        "old_egg-8.egg-info/PKG-INFO": "Metadata-Version: 1.0\nName: old-egg\nVersion: 8\n",
        "tab-9.dist-info/METADATA": "Name:\tTabbed\nVersion: 9\nX:\n\tfolded\n",
    }
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode())
    truth = sorted({f"{d.metadata['Name']}=={d.version}"
                    for d in metadata.distributions(path=[str(tmp_path)])
                    if d.metadata["Name"]}, key=str.lower)
    assert len(truth) == len(files) - 2  # noname's; after's ("not a header" ends them)
    assert provenance.installed([str(tmp_path)]) == truth
