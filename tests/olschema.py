"""Validate OpenLineage events against the official schemas, offline.

Every schema file of the OpenLineage spec (`../shared/openlineage-spec`, or $ROAR_OPENLINEAGE_SPEC)
and of roar (`roar_core/schemas`) is loaded into one `referencing.Registry` keyed by `$id`, so
`$ref`s between files resolve locally and nothing is fetched. An event validates against
`OpenLineage.json#/$defs/RunEvent`; the base schema only checks that facets look like facets, so
each facet is also validated against the file whose `properties` names its key, for the kind of
slot it sits in (run, job, dataset, input, output). Unknown facet keys are errors: a typo in a
facet name would otherwise pass silently and be ignored by every consumer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

REPO = Path(__file__).resolve().parents[1]
ROAR_SCHEMAS = REPO / "roar_core" / "schemas"
OL_BASE = "https://openlineage.io/spec/2-0-2/OpenLineage.json"
# Facet slots and the base facet their schema must extend to be allowed there.
SLOTS = ("RunFacet", "JobFacet", "DatasetFacet", "InputDatasetFacet", "OutputDatasetFacet")

FORMATS = FormatChecker()


@FORMATS.checks("date-time", raises=ValueError)
def _offset_date_time(value: object) -> bool:
    # jsonschema only checks date-time with an optional extra package; Marquez needs an
    # explicit offset, so check that here rather than trust the default (which accepts all).
    if not isinstance(value, str):
        return True
    if "T" not in value.upper():
        raise ValueError(f"no time part in {value!r}")
    if datetime.fromisoformat(value.replace("Z", "+00:00")).tzinfo is None:
        raise ValueError(f"no UTC offset in {value!r}")
    return True


def spec_dir() -> Path:
    override = os.environ.get("ROAR_OPENLINEAGE_SPEC")
    path = Path(override) if override else REPO.parent / "shared" / "openlineage-spec"
    if not (path / "OpenLineage.json").is_file():
        raise FileNotFoundError(
            f"OpenLineage spec not found at {path}; set ROAR_OPENLINEAGE_SPEC to the folder "
            "holding OpenLineage.json and facets/"
        )
    return path


def _schema_files() -> Iterator[Path]:
    spec = spec_dir()
    yield spec / "OpenLineage.json"
    yield from sorted((spec / "facets").glob("*.json"))
    yield from sorted(ROAR_SCHEMAS.glob("*.json"))


@cache
def schemas() -> dict[str, dict[str, Any]]:
    """`$id` -> schema document, for every schema file."""
    docs: dict[str, dict[str, Any]] = {}
    for path in _schema_files():
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc["$id"] in docs:
            raise ValueError(f"duplicate schema $id {doc['$id']} in {path}")
        docs[doc["$id"]] = doc
    return docs


@cache
def registry() -> Registry:
    return Registry().with_resources(
        (uri, Resource(contents=doc, specification=DRAFT202012)) for uri, doc in schemas().items()
    )


def _bases(doc: dict[str, Any], node: Any, seen: set[str]) -> set[str]:
    """Names of the OpenLineage base facets that `node` extends, following local $refs."""
    found: set[str] = set()
    if not isinstance(node, dict):
        return found
    ref = node.get("$ref", "")
    if ref.startswith("#/$defs/"):
        name = ref.rsplit("/", 1)[1]
        if name not in seen:
            seen.add(name)
            found |= _bases(doc, doc["$defs"][name], seen)
    elif ref.startswith(f"{OL_BASE}#/$defs/"):
        found.add(ref.rsplit("/", 1)[1])
    for combinator in ("allOf", "oneOf", "anyOf"):
        for sub in node.get(combinator, []):
            found |= _bases(doc, sub, seen)
    return found


@cache
def facet_schemas() -> dict[str, dict[str, str]]:
    """slot ("RunFacet", ...) -> facet key -> `$id` of the schema that defines it there."""
    table: dict[str, dict[str, str]] = {slot: {} for slot in SLOTS}
    for uri, doc in schemas().items():
        for key, prop in doc.get("properties", {}).items():
            for slot in _bases(doc, prop, set()) & set(SLOTS):
                if key in table[slot]:
                    raise ValueError(f"{slot} facet {key!r} defined twice: {uri}")
                table[slot][key] = uri
    return table


@cache
def _validator(uri: str, fragment: str = "") -> Draft202012Validator:
    return Draft202012Validator(
        {"$ref": f"{uri}#{fragment}" if fragment else uri},
        registry=registry(),
        format_checker=FORMATS,
    )


def _facets(event: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(slot, where, facets) for every facet map in the event."""
    yield "RunFacet", "run.facets", event.get("run", {}).get("facets") or {}
    yield "JobFacet", "job.facets", event.get("job", {}).get("facets") or {}
    for side, extra in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        for i, ds in enumerate(event.get(side) or []):
            yield "DatasetFacet", f"{side}[{i}].facets", ds.get("facets") or {}
            slot = "InputDatasetFacet" if side == "inputs" else "OutputDatasetFacet"
            yield slot, f"{side}[{i}].{extra}", ds.get(extra) or {}


def validate_event(event: dict[str, Any]) -> None:
    """Raise `ValidationError` unless `event` is a valid RunEvent with only known facets."""
    _validator(OL_BASE, "/$defs/RunEvent").validate(event)
    known = facet_schemas()
    for slot, where, facets in _facets(event):
        for key, facet in facets.items():
            uri = known[slot].get(key)
            if uri is None:
                raise ValidationError(f"{where}: unknown {slot} {key!r}")
            try:
                _validator(uri).validate({key: facet})
            except ValidationError as e:
                raise ValidationError(f"{where}.{key}: {e.message}") from e
            # The facet must say which schema version it follows, and that must be the one
            # we validated against: a client bump that changes a facet shows up here.
            declared = facet.get("_schemaURL", "").split("#", 1)[0]
            if declared != uri:
                raise ValidationError(f"{where}.{key}: _schemaURL {declared!r} is not {uri!r}")


def validate_json(text: str) -> dict[str, Any]:
    """Parse one serialized event, validate it and return it."""
    event = json.loads(text)
    validate_event(event)
    return event
