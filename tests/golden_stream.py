"""A home's lineage, normalised for comparing two versions of roar: every event (minus
times, producers, pids, hosts; run ids and the work directory replaced by placeholders),
grouped by run, and the store's runs with their accesses.  What an engine emits and stores
for one workflow must stay the same across refactors, except reviewed fixes."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

VOLATILE = {"eventTime", "producer", "_producer", "_schemaURL", "schemaURL", "pid", "host",
            "nominalStartTime", "nominalEndTime", "startTime", "endTime",
            # the machine and Python environment the stream was made on (tests/core/
            # test_provenance.py checks them against this machine)
            "roar_machine", "roar_environment"}
# Versions of the engine and libraries installed (CI installs the newest allowed).
VERSION_KEYS = {"version", "openlineageAdapterVersion", "openlineage_client_version"}
ENGINE_IDS = {"engineTaskId", "nodeId"}  # the engine's own ids of a task and node


def stream(home: Path, workdir: Path) -> dict[str, Any]:
    from roar_core.pipeline.store import Store

    wd = str(workdir)
    path = home / "openlineage" / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ids = {e["run"]["runId"] for e in events}

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if x.get("key") in VERSION_KEYS:  # a key-value facet entry
                return {"key": x["key"], "value": "<version>"}
            return {walk(k): "<version>" if k in VERSION_KEYS and isinstance(v, str)
                    else "<id>" if k in ENGINE_IDS else walk(v)
                    for k, v in sorted(x.items()) if k not in VOLATILE}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str):
            return "<run>" if x in ids else x.replace(wd, "<wd>")
        return x

    runs: dict[str, list] = {}
    for e in events:
        runs.setdefault(e["run"]["runId"], []).append(walk(e))
    with Store.open(home=home) as store:
        rows = [{"job": r.job_name, "status": r.status, "engine": r.engine,
                 "accesses": sorted([a.uri.replace(wd, "<wd>"), a.role, a.digest]
                                    for a in store.accesses_of(r.run_id))}
                for r in store.task_runs(limit=1000)]
    return {"events": sorted(runs.values(), key=lambda v: json.dumps(v, sort_keys=True)),
            "runs": sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))}


def task_lineage(events: list[dict], data: Path, home: Path) -> dict[str, Any]:
    """What roar adds to an engine's own events (Airflow's provider sends them): per task
    event, its inputs and outputs with their versions and roar's run facets (minus pids,
    hosts and times); and the store's runs with their accesses."""
    from roar_core.pipeline.store import Store

    wd = str(data)
    tmp = re.compile(re.escape(tempfile.gettempdir()) + r"/[^/]+")  # mkdtemp()'s names

    def files(ds: list[dict]) -> list:
        return sorted([d["namespace"], d["name"].replace(wd, "<wd>"),
                       d.get("facets", {}).get("version", {}).get("datasetVersion"),
                       d.get("outputFacets", {}).get("outputStatistics", {}).get("size")]
                      for d in ds)

    def roar_facets(facets: dict) -> dict:
        out = {}
        for key, value in sorted(facets.items()):
            if key.startswith("roar_"):
                out[key] = {k: v for k, v in sorted(value.items())
                            if k not in VOLATILE and k not in ENGINE_IDS
                            and not k.startswith("_")}
        return json.loads(json.dumps(out).replace(wd, "<wd>"))

    got = sorted(([e["eventType"], e["job"]["name"], files(e.get("inputs", [])),
                   files(e.get("outputs", [])), roar_facets(e["run"].get("facets", {}))]
                  for e in events if e["eventType"] != "START"), key=_key)
    with Store.open(home=home) as store:
        rows = sorted([r.job_name, r.status, r.engine,
                       sorted([tmp.sub("<tmp>", a.uri.replace(wd, "<wd>")), a.role, a.digest]
                              for a in store.accesses_of(r.run_id))]
                      for r in store.task_runs(limit=1000))
    return {"events": got, "runs": rows}


def _key(x: Any) -> str:
    return json.dumps(x, sort_keys=True)
