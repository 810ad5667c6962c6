"""A producer publishing its traced outputs through an AssetAlias, and a consumer DAG
scheduled on that alias (the LocalExecutor test)."""

import pendulum
from airflow.sdk import AssetAlias, dag, task
from roar_airflow.operators.roar import RoarBashOperator

ALIAS = "roar-test-outputs"


@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False, tags=["roar-test"])
def roar_producer():
    @task.roar(roar_asset_alias=ALIAS)
    def produce() -> str:
        import os

        path = os.path.join(os.environ["ROAR_TEST_AIRFLOW_DATA"], "produced.txt")
        with open(path, "w") as f:
            f.write("made by roar_producer\n")
        return path

    # bash as Airflow 3 starts it (stdin a socket): it reads ~/.bashrc, which is no input.
    shell = RoarBashOperator(
        task_id="shell",
        bash_command='cd "$ROAR_TEST_AIRFLOW_DATA" && wc -c < produced.txt > size.txt',
    )
    produce() >> shell


@dag(schedule=[AssetAlias(ALIAS)], start_date=pendulum.datetime(2024, 1, 1), catchup=False,
     tags=["roar-test"])
def roar_consumer():
    @task.roar
    def consume(**context) -> None:
        import json
        import os

        seen = [{"uri": e.asset.uri, "extra": dict(e.extra or {})}
                for evs in context["triggering_asset_events"].values() for e in evs]
        path = os.path.join(os.environ["ROAR_TEST_AIRFLOW_DATA"], "consumed.json")
        with open(path, "w") as f:
            json.dump(seen, f)

    consume()


roar_producer()
roar_consumer()
