"""What Airflow's ProvidersManager reads through the `apache_airflow_provider` entry point."""

from __future__ import annotations


def get_provider_info() -> dict:
    return {
        "package-name": "roar-core",
        "name": "roar",
        "description": "Observed lineage for Airflow tasks: `@task.roar` traces a task's real "
        "file I/O and reports it, with content hashes, in the OpenLineage events Airflow sends.",
        "integrations": [
            {
                "integration-name": "roar",
                "external-doc-url": "https://roar.dev/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {"integration-name": "roar", "python-modules": ["roar_airflow.operators.roar"]}
        ],
        "hooks": [{"integration-name": "roar", "python-modules": ["roar_airflow.hooks.roar"]}],
        "task-decorators": [
            {"class-name": "roar_airflow.decorators.roar.roar_task", "name": "roar"}
        ],
        # Imports the task path once in a traced scheduler/worker, before it forks tasks.
        "plugins": [{"name": "roar", "plugin-class": "roar_airflow.plugins.roar.RoarPlugin"}],
    }
