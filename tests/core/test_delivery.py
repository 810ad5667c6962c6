from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from openlineage.client.serde import Serde

from roar_core.pipeline import delivery
from roar_core.pipeline import emission as em
from tests.core.test_spool import lineage_events


@pytest.fixture(autouse=True)
def isolated_openlineage_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    saved = dict(os.environ)  # the client writes to os.environ when it aliases OPENLINEAGE_URL
    for name in list(os.environ):
        if name.startswith("OPENLINEAGE"):
            del os.environ[name]
    monkeypatch.chdir(tmp_path)
    yield
    os.environ.clear()
    os.environ.update(saved)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_rebuilt_event_serializes_exactly_as_spooled() -> None:
    for event in lineage_events(runs=2):
        data = em.to_dict(event)
        assert Serde.to_dict(delivery.rebuild_event(data)) == data


def test_rebuild_types_the_facets_the_client_reads() -> None:
    data = em.to_dict(lineage_events(runs=0)[0])
    data["run"]["facets"]["tags"] = {
        "_producer": "p",
        "_schemaURL": "https://openlineage.io/spec/facets/1-0-0/TagsRunFacet.json#/$defs/TagsRunFacet",
        "tags": [{"key": "team", "value": "ml", "source": "USER"}],
    }
    event = delivery.rebuild_event(data)
    assert Serde.to_dict(event) == data
    assert not isinstance(event.run.facets["tags"], dict)  # emit() reads `.tags` on it


def test_http_transport_fails_fast() -> None:
    # The client's defaults retry 5 times with backoff (~9 s per event); the spool retries
    # itself, so one send must fail within a moment and raise.
    os.environ["OPENLINEAGE_URL"] = closed_port_url()
    client = delivery.make_client()
    data = em.to_dict(lineage_events(runs=0)[0])
    start = time.monotonic()
    with pytest.raises(requests.ConnectionError):
        delivery.send(client, data)
    assert time.monotonic() - start < 2.0


def test_malformed_event_is_rejected_not_retried() -> None:
    os.environ["OPENLINEAGE_DISABLED"] = "true"
    client = delivery.make_client()
    with pytest.raises(delivery.Rejected, match="not a RunEvent"):
        delivery.send(client, {"eventTime": "2026-03-01T00:00:00+00:00", "job": {}})
    with pytest.raises(delivery.Rejected):
        bad_id = em.to_dict(lineage_events(runs=0)[0])
        bad_id["run"]["runId"] = "not-a-uuid"
        delivery.send(client, bad_id)


@pytest.mark.parametrize("field, value", [
    ("runId", "not-a-uuid"),
    ("eventTime", "yesterday"),
    ("eventTime", "2026-03-01"),  # a date without a time of day
    ("eventTime", 1700000000),
    ("producer", "http://[::1"),  # a URL urlparse refuses
    ("schemaURL", "http://[::1"),
])
def test_rebuild_refuses_what_the_clients_validators_refuse(field: str, value) -> None:
    """The rebuild builds the client's classes with attrs' validators off and checks the
    same fields itself: each case the client's own validators refuse (built with them on,
    the reference) is refused too, and a good event comes out as the client builds it."""
    import attr

    good = em.to_dict(lineage_events(runs=0)[0])
    reference = delivery._rebuilt(good)  # validators on
    assert Serde.to_dict(delivery.rebuild_event(good)) == Serde.to_dict(reference)
    assert not attr.validators.get_disabled()  # back on for everything else
    bad = em.to_dict(lineage_events(runs=0)[0])
    (bad["run"] if field == "runId" else bad)[field] = value
    with pytest.raises((ValueError, TypeError)):
        delivery._rebuilt(bad)
    with pytest.raises((ValueError, TypeError)):
        delivery.rebuild_event(bad)
    os.environ["OPENLINEAGE_DISABLED"] = "true"
    with pytest.raises(delivery.Rejected):
        delivery.send(delivery.make_client(), bad)
    assert not attr.validators.get_disabled()


def test_http_status_of_wrapped_errors() -> None:
    response = requests.Response()
    response.status_code = 422
    cause = requests.HTTPError("422", response=response)
    try:
        try:
            raise cause
        except requests.HTTPError as e:
            raise RuntimeError("Transport failed to emit event") from e
    except RuntimeError as wrapped:
        assert delivery.http_status(wrapped) == 422
    assert delivery.http_status(requests.ConnectionError("refused")) is None


def test_hold_only_when_nothing_is_configured() -> None:
    assert delivery.hold_reason(delivery.make_client()) is not None  # console fallback
    os.environ["OPENLINEAGE__TRANSPORT__TYPE"] = "console"
    assert delivery.hold_reason(delivery.make_client()) is None  # asked for explicitly


class _Unwalked(dict):
    """os.environ for the length of a send: reading a variable is fine, a walk is not."""

    def items(self):  # type: ignore[override]
        raise AssertionError("the whole environment was walked for an event")


@pytest.mark.parametrize("collect", [[], ["ROAR_TEST_TEAM"]])
def test_clients_we_make_walk_the_environment_only_to_collect_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collect: list[str]
) -> None:
    # The official client decodes all of os.environ for every event to find the variables
    # it is configured to collect; with none configured ours does not, and with some it
    # sends them as the official client does.
    from openlineage.client import OpenLineageClient

    os.environ["ROAR_TEST_TEAM"] = "ml"
    config = {"transport": {"type": "file", "log_file_path": str(tmp_path / "ours.jsonl"),
                            "append": True},
              "facets": {"environment_variables": collect}}
    ours = delivery.Client(config=config)
    official = OpenLineageClient(config={**config, "transport": {
        **config["transport"], "log_file_path": str(tmp_path / "official.jsonl")}})
    data = em.to_dict(lineage_events(runs=0)[0])
    delivery.send(official, data)
    if collect:
        delivery.send(ours, data)
    else:
        with monkeypatch.context() as m:
            m.setattr(os, "environ", _Unwalked(os.environ))
            delivery.send(ours, data)
    sent = [json.loads((tmp_path / f"{name}.jsonl").read_text())
            for name in ("ours", "official")]
    assert sent[0] == sent[1]
    env_facet = sent[0]["run"]["facets"].get("environmentVariables")
    assert (env_facet and env_facet["environmentVariables"]) == (
        [{"name": "ROAR_TEST_TEAM", "value": "ml"}] if collect else None)


def test_the_clients_roar_makes_are_ours() -> None:
    from roar_core import config as config_mod
    from roar_core.api import default_client

    assert isinstance(delivery.make_client(), delivery.Client)
    cfg = config_mod.load(env={"ROAR_HOME": str(Path.cwd() / ".roar")})
    assert isinstance(default_client(cfg), delivery.Client)
    os.environ["OPENLINEAGE_URL"] = closed_port_url()
    assert isinstance(default_client(cfg), delivery.Client)


def test_a_client_whose_variables_method_changed_shape_collects_its_own_way() -> None:
    # A later client that, say, passes the event to the method: ours steps aside.
    from openlineage.client import OpenLineageClient

    class Later(OpenLineageClient):
        def _collect_environment_variables(self, event=None):  # type: ignore[override]
            return {"FROM": "the event"} if event is not None else {}

    client = type("Ours", (delivery.Client, Later), {})(config={"transport": {"type": "noop"}})
    assert client._collect_environment_variables("an event") == {"FROM": "the event"}
    assert client._collect_environment_variables() == {}
