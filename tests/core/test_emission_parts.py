"""Pieces of a task event for engines that emit the event themselves (Airflow's provider)."""

from __future__ import annotations

from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.serde import Serde

from roar_core.pipeline import emission as em

DIGEST = "ab" * 32


def test_datasets_carry_the_same_facets_as_our_events() -> None:
    d = em.Dataset("file", "/data/x.csv", digest=DIGEST, size=5, lifecycle="CREATE",
                   symlinks=[("file", "/link/x.csv")])
    lineage = em.TaskLineage(namespace="ns", job_name="j", run_id=em.new_run_id(),
                             inputs=[d], outputs=[d])
    event = Serde.to_dict(em.complete_event(lineage))
    inp, out = em.input_dataset(d), em.output_dataset(d)
    assert isinstance(inp, InputDataset) and isinstance(out, OutputDataset)
    assert Serde.to_dict(inp) == event["inputs"][0]
    assert Serde.to_dict(out) == event["outputs"][0]


def test_task_run_facets_are_roars_only() -> None:
    info = em.TaskInfo(engine="airflow", engine_task_id="t", host="h", pid=1, attempt=2)
    lineage = em.TaskLineage(namespace="ns", job_name="j", run_id=em.new_run_id(), task=info,
                             io=em.IOCheck(undeclared_reads=["/a"]),
                             parent=em.RunRef("ns", "dag", em.new_run_id()))
    facets = em.task_run_facets(lineage)
    assert set(facets) == {"roar_task", "roar_io"}  # no parent: the engine adds its own
    event = Serde.to_dict(em.complete_event(lineage))
    for key, facet in facets.items():
        assert Serde.to_dict(facet) == event["run"]["facets"][key]
