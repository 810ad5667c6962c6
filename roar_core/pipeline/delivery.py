"""Sending one spooled event through the official openlineage-python client.

The client does the transport (HTTP, Kafka, file, composite...) and its configuration
(`openlineage.yml`, `OPENLINEAGE_URL`, `OPENLINEAGE__TRANSPORT__*`, `OPENLINEAGE_DISABLED`);
this module only adapts it to a durable queue: fail fast instead of retrying inside a send,
tell "try later" from "this event is invalid", and rebuild the client's event class from JSON.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from uuid import UUID

import attr
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import environment_variables_run, tags_job, tags_run

if TYPE_CHECKING:
    from openlineage.client.transport import Transport

log = logging.getLogger(__name__)

# HTTP statuses meaning "this event is invalid" rather than "try later": retrying would block
# every later event forever, so such events are set aside. Auth and routing errors (401, 403,
# 404) are configuration problems that get fixed: those events wait.
PERMANENT_STATUS = frozenset({400, 409, 413, 415, 422})
# With the client's defaults (5 urllib3 retries, backoff 0.3 s) one failed send blocks for ~9 s
# plus timeouts; the spool retries forever with its own capped backoff, so one try is enough.
# raise_on_status=False: a 5xx comes back as a response and raise_for_status reports its code.
_ONE_TRY: dict[str, Any] = {"total": 0, "raise_on_status": False}


class Rejected(Exception):
    """The event can never be delivered as it is (malformed, or refused by the backend)."""


class TooSlow(Exception):
    """The backend took the connection and did not answer this event in time: too big or
    too slow for it (resending it as it is may never succeed; a backend that is down
    refuses or never takes the connection instead)."""


class Client(OpenLineageClient):
    """The official client, minus a walk of the whole environment for every event."""

    def _collect_environment_variables(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        # The client reads (and decodes) every variable of os.environ, for each event, to
        # pick the ones it is configured to collect: none unless configured, and ~20 us an
        # event, ~4 % of a small task's recording with events.  (A client whose method or
        # configuration has changed shape does it its own way: an override that failed
        # here would fail every send.)
        try:
            wanted = self.config.facets.environment_variables
        except AttributeError:
            wanted = True
        if not wanted and not args and not kwargs:
            return {}
        return super()._collect_environment_variables(*args, **kwargs)


def make_client() -> OpenLineageClient:
    """A client configured the standard ways, with fail-fast HTTP transports."""
    client = Client()
    limit_retries(client.transport)
    return client


def limit_retries(transport: Transport) -> None:
    """Make HTTP transports (also inside a composite) try once and raise on failure."""
    from openlineage.client.transport.composite import CompositeTransport
    from openlineage.client.transport.http import HttpTransport
    from requests.adapters import HTTPAdapter
    from urllib3.util import Retry

    if isinstance(transport, CompositeTransport):
        for child in transport.transports:
            limit_retries(child)
    elif isinstance(transport, HttpTransport) and transport.config.adapter is None:
        # A user-supplied adapter is left alone: it is an explicit choice.
        transport.config.retry = dict(_ONE_TRY)
        # The session may already exist with the default adapter mounted: replace it.
        transport.session.mount(transport.url, HTTPAdapter(max_retries=Retry(**_ONE_TRY)))
    elif transport.kind == "async_http":
        log.info("roar: the async_http transport queues events itself; delivery is unconfirmed")


def hold_reason(client: OpenLineageClient) -> str | None:
    """Why a client made from the environment must not be used to send, if it must not.

    With nothing configured the client falls back to printing events to the log: "delivering"
    through that would empty the spool, so events are held until a backend is configured. An
    explicitly configured console transport is respected, and OPENLINEAGE_DISABLED (a noop
    transport) consumes events unsent, as the client documents, so a deliberately disabled
    setup does not grow the spool forever.
    """
    if client.transport.kind != "console" or (client.config.transport or {}).get("type"):
        return None
    return (
        "no OpenLineage transport configured (set OPENLINEAGE_URL or write openlineage.yml; "
        "OPENLINEAGE_DISABLED=true discards events)"
    )


def send(client: OpenLineageClient, data: dict[str, Any]) -> None:
    """Emit one event; raises `Rejected` for events never deliverable, anything else to retry."""
    try:
        event = rebuild_event(data)
    except Exception as e:
        raise Rejected(f"not a RunEvent: {type(e).__name__}: {e}") from e
    try:
        client.emit(event)
    except Exception as e:
        status = http_status(e)
        if status in PERMANENT_STATUS:
            raise Rejected(f"backend refused it with HTTP {status}") from e
        if _read_timeout(e):
            raise TooSlow(f"no answer in time: {type(e).__name__}: {e}") from e
        raise


def _read_timeout(exc: BaseException) -> bool:
    """Whether the backend took the connection and then did not read the event or answer
    it in time (a slow reader times out our send: "Connection aborted", TimeoutError).
    Not a timeout while connecting: that is a backend down, for every event alike."""
    from requests.exceptions import ConnectTimeout, ReadTimeout
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectTimeout | ConnectTimeoutError | NewConnectionError):
            return False
        if isinstance(seen, ReadTimeout | TimeoutError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def http_status(exc: BaseException) -> int | None:
    """The HTTP status behind a transport error (HttpTransport raises requests.HTTPError)."""
    seen: BaseException | None = exc
    while seen is not None:
        status = getattr(getattr(seen, "response", None), "status_code", None)
        if isinstance(status, int):
            return status
        seen = seen.__cause__  # CompositeTransport wraps the transport's error
    return None


def rebuild_event(data: dict[str, Any]) -> RunEvent:
    """The client's `emit` takes only its own event classes: rebuild one from spooled JSON.

    Facets stay plain dicts (they serialize identically), except the few the client itself
    inspects while emitting (tags, environment variables), which must be its own classes.
    The client's checks of what it would check (`_checked`) run here, and its classes are
    built with attrs' validators off: those parse the time with dateutil and every URL
    with urlparse, 18 of the 28 us a rebuild took, for each event sent.  (attrs' switch is
    process-wide: an event another thread builds meanwhile goes unchecked too; roar builds
    its own from checked values, and whatever is sent is checked here.)
    """
    _checked(data)
    with attr.validators.disabled():
        return _rebuilt(data)


def _checked(data: dict[str, Any]) -> None:
    """What the client's validators reject, rejected (ValueError): a run id that is not a
    UUID, a time that is not ISO 8601 with a time of day, a URL urlparse refuses."""
    UUID(str(data["run"]["runId"]))
    when = data["eventTime"]
    try:
        datetime.fromisoformat(when)
    except (TypeError, ValueError):
        from dateutil import parser  # what the client accepts, beyond Python's forms

        parser.isoparse(when)
    if "t" not in when.lower():
        raise ValueError(f"Parsed date-time has to contain time: {when}")
    for url in (data.get("producer", ""), data.get("schemaURL", "")):
        urlsplit(url)


def _rebuilt(data: dict[str, Any]) -> RunEvent:
    run, job = data["run"], data["job"]
    event = RunEvent(
        eventTime=data["eventTime"],
        producer=data.get("producer", ""),
        eventType=RunState(data["eventType"]) if data.get("eventType") else None,
        run=Run(runId=run["runId"], facets=_typed_facets("run", run.get("facets"))),
        job=Job(
            namespace=job["namespace"],
            name=job["name"],
            facets=_typed_facets("job", job.get("facets")),
        ),
        inputs=[
            InputDataset(
                namespace=d["namespace"],
                name=d["name"],
                facets=d.get("facets") or {},
                inputFacets=d.get("inputFacets") or {},
            )
            for d in data.get("inputs") or []
        ],
        outputs=[
            OutputDataset(
                namespace=d["namespace"],
                name=d["name"],
                facets=d.get("facets") or {},
                outputFacets=d.get("outputFacets") or {},
            )
            for d in data.get("outputs") or []
        ],
    )
    if "schemaURL" in data:
        event.schemaURL = data["schemaURL"]
    return event


# (where, key) -> facet class, its list field, the item class: the facets `emit` reads.
_CLIENT_TOUCHED: dict[tuple[str, str], tuple[type, str, type]] = {
    ("run", "tags"): (tags_run.TagsRunFacet, "tags", tags_run.TagsRunFacetFields),
    ("job", "tags"): (tags_job.TagsJobFacet, "tags", tags_job.TagsJobFacetFields),
    ("run", "environmentVariables"): (
        environment_variables_run.EnvironmentVariablesRunFacet,
        "environmentVariables",
        environment_variables_run.EnvironmentVariable,
    ),
}


def _typed_facets(where: str, facets: dict[str, Any] | None) -> dict[str, Any]:
    out = dict(facets or {})
    for key, value in out.items():
        spec = _CLIENT_TOUCHED.get((where, key))
        if spec is None or not isinstance(value, dict):
            continue
        facet_cls, field_name, item_cls = spec
        try:
            items = [item_cls(**item) for item in value.get(field_name) or []]
            urlsplit(value.get("_producer", ""))  # the facet's validator, off (rebuild_event)
            out[key] = facet_cls(**{field_name: items}, producer=value.get("_producer", ""))
        except TypeError:
            pass  # fields this client does not know: keep the dict rather than drop data
    return out
