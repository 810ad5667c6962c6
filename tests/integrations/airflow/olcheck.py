"""Validating the events Airflow's OpenLineage provider sends, honestly.

`tests.olschema.validate_event` checks the RunEvent envelope and every facet against the
OpenLineage spec and roar's schemas, and rejects facets it has no schema for.  The provider
adds its own facets: those it ships a JSON schema for (AirflowRunFacet.json & co., inside the
provider package) are checked against that schema here, the rest cannot be checked; both are
reported by name (the provider's facets do not all match its own schemas: provider 2.20.3
omits `taskInstance.pool` and sends `task.retry_exponential_backoff` as a number), so a test
can assert exactly which they are.  Everything else -- envelope, official facets, roar's
facets -- goes through `validate_event` unchanged and must be valid.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Resource
from referencing.jsonschema import DRAFT202012

from tests.olschema import FORMATS, facet_schemas, registry, validate_event

SLOT_OF_SUFFIX = {"RunFacet": "RunFacet", "JobFacet": "JobFacet", "DatasetFacet": "DatasetFacet"}


@cache
def provider_schemas() -> dict[tuple[str, str], Draft202012Validator]:
    """(slot, facet key) -> validator, from the provider's shipped facet schemas."""
    import airflow.providers.openlineage as ol

    reg = registry()
    out: dict[tuple[str, str], Draft202012Validator] = {}
    for path in sorted((Path(ol.__file__).parent / "facets").glob("*.json")):
        doc = json.loads(path.read_text())
        uri = doc.get("$id") or f"urn:airflow-provider-openlineage:{path.name}"
        doc = {**doc, "$id": uri}
        slot = next((s for suffix, s in SLOT_OF_SUFFIX.items() if path.stem.endswith(suffix)),
                    None)
        if slot is None:
            continue
        res = reg.with_resource(uri, Resource(contents=doc, specification=DRAFT202012))
        for key in doc.get("properties", {}):
            out[(slot, key)] = Draft202012Validator({"$ref": uri}, registry=res,
                                                    format_checker=FORMATS)
    return out


def _facet_maps(event: dict[str, Any]):
    yield "RunFacet", "run.facets", event.get("run", {}).get("facets")
    yield "JobFacet", "job.facets", event.get("job", {}).get("facets")
    for side in ("inputs", "outputs"):
        for i, ds in enumerate(event.get(side) or []):
            yield "DatasetFacet", f"{side}[{i}].facets", ds.get("facets")


@dataclass
class Report:
    unchecked: list[str] = field(default_factory=list)  # facets no schema covers
    provider_errors: list[str] = field(default_factory=list)  # provider facets vs its schemas


def validate_provider_event(event: dict[str, Any]) -> Report:
    """Raise unless the envelope and every facet we have a schema for are valid; report the
    provider's own facets (unchecked, or not matching the provider's schema)."""
    event = copy.deepcopy(event)
    ours = facet_schemas()
    provider = provider_schemas()
    report = Report()
    for slot, where, facets in _facet_maps(event):
        for key in list(facets or {}):
            if key in ours[slot]:
                continue
            validator = provider.get((slot, key))
            if validator is None:
                report.unchecked.append(f"{where}.{key}")
            else:
                for err in validator.iter_errors({key: facets[key]}):
                    path = ".".join(str(p) for p in err.absolute_path)
                    report.provider_errors.append(f"{where}.{path}: {err.message}")
            del facets[key]
    validate_event(event)
    return report
