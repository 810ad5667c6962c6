"""The benchmarks' raw numbers as JSON, for `bench/report` to chart.

One file per benchmark run: the machine, and a list of scenarios.  A scenario compares
samples of a baseline (the command or engine without roar) with one or more variants
(roar-core, roar-cli), all in one unit, measured interleaved in the same run:

    {"bench": "core", "title": ..., "machine": {...}, "scenarios": [
        {"name": "`roar-core run true`", "unit": "ms", "lower_is_better": true,
         "baseline": {"label": "true", "samples": [...]},
         "variants": [{"label": "roar-core run", "samples": [...]}, ...],
         "note": "..."}]}
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path


def machine() -> dict[str, object]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), "")
    except OSError:
        pass
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
            "cpu": cpu, "python": platform.python_version(), "kernel": platform.release(),
            "load": round(os.getloadavg()[0], 2)}


def scenario(name: str, unit: str, baseline: tuple[str, list[float]] | None,
             variants: list[tuple[str, list[float]]], note: str = "") -> dict[str, object]:
    return {"name": name, "unit": unit,
            "baseline": None if baseline is None else
            {"label": baseline[0], "samples": list(baseline[1])},
            "variants": [{"label": label, "samples": list(s)} for label, s in variants if s],
            "note": note}


def write(path: Path | str | None, bench: str, title: str,
          scenarios: list[dict[str, object]]) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"bench": bench, "title": title, "machine": machine(),
                             "scenarios": scenarios}, indent=1))
    print(f"(raw numbers: {p})")
