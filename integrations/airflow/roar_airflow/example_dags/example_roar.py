"""Example: observed lineage for a small ETL, and a DAG scheduled on what it wrote.

    pip install "roar-core[airflow]"
    eval "$(roar-core env airflow)"   # in the shell that starts the scheduler (LocalExecutor)
    airflow scheduler                 # or `airflow celery worker`; api-server and
                                      # dag-processor need nothing

Every `@task.roar` task's COMPLETE (or FAIL) OpenLineage event -- sent by Airflow's
OpenLineage provider, under the DAG run -- lists the files the task really read and wrote,
each with its blake3 digest (`version` and `contentHash` facets).  Without the one-liner the
callables run in a traced subprocess instead (like `@task.external_python`: keep imports
inside them, and no globals), and the task log says so.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import AssetAlias, dag, task

from roar_airflow.operators.roar import RoarBashOperator

DATA = "/tmp/roar-example"
OUTPUTS = "roar-example-outputs"


@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False,
     tags=["roar", "example"])
def example_roar_etl():
    @task.roar
    def extract() -> str:
        import os

        data = "/tmp/roar-example"  # not a global: subprocess mode runs only this function
        os.makedirs(data, exist_ok=True)
        path = os.path.join(data, "raw.csv")
        with open(path, "w") as f:
            f.write("id,value\n1,10\n2,20\n")
        return path

    @task.roar
    def transform(raw: str) -> str:
        clean = raw.replace("raw", "clean")
        with open(raw) as src, open(clean, "w") as dst:
            dst.write(src.read().upper())
        return clean

    # Outputs published as asset events through an alias, digest in `extra`.
    @task.roar(roar_asset_alias=OUTPUTS)
    def load(clean: str) -> None:
        with open(clean) as src, open(clean + ".report", "w") as dst:
            dst.write(f"{len(src.readlines()) - 1} rows\n")

    # A classic operator, traced: bash and everything it runs.
    archive = RoarBashOperator(task_id="archive",
                               bash_command=f"tar -czf {DATA}/archive.tgz -C {DATA} clean.csv")

    clean = transform(extract())
    load(clean)
    clean >> archive


@dag(schedule=[AssetAlias(OUTPUTS)], start_date=pendulum.datetime(2024, 1, 1), catchup=False,
     tags=["roar", "example"])
def example_roar_downstream():
    @task.roar
    def summarize(**context) -> None:
        for events in context["triggering_asset_events"].values():
            for event in events:
                print(event.asset.uri, event.extra["digest"])

    summarize()


example_roar_etl()
example_roar_downstream()
