"""`roar-core export RUN|PATH --format ro-crate|prov -o OUT`: a run, or a file's recorded
lineage, in the formats provenance tools read.

- `ro-crate`: a Workflow Run RO-Crate of the Process Run Crate profile (0.5), written with
  the `rocrate` library: one CreateAction per task run with its inputs as `object`, outputs
  as `result`, the job as `instrument` (a SoftwareApplication, with its scripts), times and
  `actionStatus`.  Files are data entities by their location (`file:///...`, `s3://...`),
  not copied, with their blake3 as `identifier`.
- `prov`: W3C PROV-JSON, written with the `prov` library: a file version is an entity, a
  task run an activity that `used` and generated them, the host an agent.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from roar_core.cli import reproduce
from roar_core.cli.reproduce import Plan
from roar_core.pipeline.store import Store

FORMATS = ("ro-crate", "prov")
PROCESS_RUN_CRATE = "https://w3id.org/ro/wfrun/process/0.5"
RO_CRATE = "https://w3id.org/ro/crate/1.1"
_STATUS = {"COMPLETE": "http://schema.org/CompletedActionStatus",
           "FAIL": "http://schema.org/FailedActionStatus",
           "ABORT": "http://schema.org/FailedActionStatus",
           "RUNNING": "http://schema.org/ActiveActionStatus"}


class MissingLibrary(RuntimeError):
    """The format's library is not installed (the message says how to install it)."""


def run_plan(store: Store, run_id: str) -> Plan:
    """One run, as a plan of one step (what `export RUN` writes)."""
    return Plan(run_id, [reproduce.step(store, run_id, None)])


def _location(uri: str) -> str:
    return "file://" + quote(uri) if uri.startswith("/") else uri


def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] or uri


def _time(t: datetime | None) -> str | None:
    return t.astimezone(timezone.utc).isoformat() if t else None


def ro_crate(plan: Plan, out: Path, license_url: str | None = None) -> Path:
    try:
        from rocrate.model.contextentity import ContextEntity
        from rocrate.model.file import File
        from rocrate.rocrate import ROCrate
    except ImportError:
        raise MissingLibrary("RO-Crate export needs the rocrate library: "
                             "pip install 'roar-core[provenance]'") from None
    crate = ROCrate(version="1.1")
    root = crate.root_dataset
    root["name"] = f"Lineage of {plan.key}"
    root["description"] = (f"The task runs that made {plan.key}, as roar-core observed "
                           "them: the files each read and wrote, by blake3 content digest.")
    root["datePublished"] = datetime.now(timezone.utc).isoformat()
    root["conformsTo"] = {"@id": PROCESS_RUN_CRATE}
    crate.metadata["conformsTo"] = {"@id": RO_CRATE}
    crate.add(ContextEntity(crate, PROCESS_RUN_CRATE, properties={
        "@type": "CreativeWork", "name": "Process Run Crate", "version": "0.5"}))
    if license_url:
        root["license"] = {"@id": license_url}
    else:
        root["license"] = crate.add(ContextEntity(crate, "#license", properties={
            "@type": "CreativeWork",
            "name": "No license was given (roar-core export --license URL names one)"}))
    files: dict[tuple[str, str], object] = {}

    def entity(uri: str, digest: str):
        key = (uri, digest)
        if key not in files:
            # One entity per location; a second version of a file at that location is
            # told apart by its digest fragment.
            ident = _location(uri)
            if any(k[0] == uri for k in files):
                ident += "#" + digest.removeprefix("blake3:")
            files[key] = crate.add(File(crate, ident, fetch_remote=False, validate_url=False,
                                        properties={"name": _name(uri), "identifier": digest}))
        return files[key]

    actions = []
    for step in plan.steps:
        r = step.run
        tool = crate.add(ContextEntity(crate, f"#job-{quote(r.job_name)}", properties={
            "@type": "SoftwareApplication", "name": r.job_name}))
        code = [entity(c.path, "blake3:" + c.digest.removeprefix("blake3:")) for c in r.code]
        if code:
            tool["hasPart"] = code
        props = {"@type": "CreateAction", "name": f"Run of {r.job_name}",
                 "identifier": r.run_id, "actionStatus": {"@id": _STATUS.get(
                     r.status, _STATUS["RUNNING"])},
                 "startTime": _time(r.started_at), "endTime": _time(r.ended_at),
                 "description": " ".join(r.command) if r.command else r.job_name}
        action = crate.add_action(
            tool, object=[entity(i.uri, i.recorded) for i in step.inputs],
            result=[entity(u, d) for u, d in step.outputs],
            properties={k: v for k, v in props.items() if v is not None})
        actions.append(action)
    root["mentions"] = actions
    crate.write(out)
    return out / "ro-crate-metadata.json"


def prov_json(plan: Plan, out: Path) -> Path:
    try:
        from prov.model import ProvDocument
    except ImportError:
        raise MissingLibrary("PROV export needs the prov library: "
                             "pip install 'roar-core[provenance]'") from None
    doc = ProvDocument()
    doc.add_namespace("roar", "https://roar.dev/ns/")
    doc.add_namespace("run", "urn:roar:run:")
    doc.add_namespace("version", "urn:roar:version:")
    doc.add_namespace("host", "urn:roar:host:")
    versions: dict[tuple[str, str], object] = {}

    def entity(uri: str, digest: str):
        key = (uri, digest)
        if key not in versions:
            n = len(versions)
            versions[key] = doc.entity(f"version:{n}-{digest.removeprefix('blake3:')}", {
                "prov:location": _location(uri), "prov:label": _name(uri),
                "roar:digest": digest})
        return versions[key]

    for step in plan.steps:
        r = step.run
        act = doc.activity(f"run:{r.run_id}", r.started_at, r.ended_at, {
            "prov:label": r.job_name, "roar:status": r.status,
            "roar:command": " ".join(r.command) if r.command else ""})
        host = doc.agent(f"host:{quote(r.host or 'unknown', safe='')}",
                         {"prov:label": r.host or "unknown"})
        doc.wasAssociatedWith(act, host)
        for i in step.inputs:
            doc.used(act, entity(i.uri, i.recorded))
        for uri, digest in step.outputs:
            doc.wasGeneratedBy(entity(uri, digest), act)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc.serialize(format="json", indent=2))
    return out
