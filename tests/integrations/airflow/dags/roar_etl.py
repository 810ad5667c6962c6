"""extract -> transform -> load with @task.roar, a traced BashOperator, a mapped task, one
that fails half-way, one reading an untraced copy (the join by content hash), and one
handing a secret argument to programs.  Files go
to $ROAR_TEST_AIRFLOW_DATA.  The callables import inside their bodies: in subprocess mode
they run like @task.external_python."""

import pendulum
from airflow.sdk import dag, task
from roar_airflow.operators.roar import RoarBashOperator


@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False, tags=["roar-test"])
def roar_etl():
    @task.roar
    def extract() -> str:
        import os

        path = os.path.join(os.environ["ROAR_TEST_AIRFLOW_DATA"], "raw.csv")
        with open(path, "w") as f:
            f.write("id,value\n1,10\n2,20\n3,30\n")
        return path

    @task.roar
    def transform(raw: str) -> str:
        import os

        out = os.path.join(os.path.dirname(raw), "clean.csv")
        with open(raw) as f:
            rows = f.read().splitlines()
        with open(out, "w") as f:
            f.write("\n".join(r.upper() for r in rows) + "\n")
        return out

    @task.roar(multiple_outputs=False)
    def load(clean: str) -> int:
        import os

        with open(clean) as f:
            n = len(f.read().splitlines()) - 1
        with open(os.path.join(os.path.dirname(clean), "report.txt"), "w") as f:
            f.write(f"{n} rows\n")
        return n

    @task.roar
    def checksum(path: str) -> None:
        with open(path, "rb") as f:
            data = f.read()
        with open(path + ".len", "w") as f:
            f.write(str(len(data)))

    @task.roar
    def broken(clean: str) -> None:
        import os

        with open(clean) as f:
            f.read()
        with open(os.path.join(os.path.dirname(clean), "partial.txt"), "w") as f:
            f.write("half done\n")
        raise ValueError("the transform broke half-way")

    @task
    def stage(clean: str) -> str:
        """Plain @task: a copy nobody traces, so roar sees a file it never saw produced."""
        import os
        import shutil

        staged = os.path.join(os.path.dirname(clean), "staged")
        os.makedirs(staged, exist_ok=True)
        return shutil.copy(clean, os.path.join(staged, "clean_copy.csv"))

    @task.roar
    def summarize(copy: str) -> None:
        import os

        with open(copy) as f:
            n = len(f.read().splitlines())
        with open(os.path.join(os.path.dirname(os.path.dirname(copy)), "summary.txt"), "w") as f:
            f.write(f"{n}\n")

    @task.roar
    def call_tool(clean: str, passphrase: str) -> None:
        """A secret argument handed to programs (test_secret_arguments_leave_nothing)."""
        import subprocess

        # The first program a task runs is its command: the secret as a bare argument.
        subprocess.run(["true", passphrase], check=True)
        subprocess.run(["true", "--passphrase", passphrase], check=True)

    count_lines = RoarBashOperator(
        task_id="count_lines",
        bash_command='cd "$ROAR_TEST_AIRFLOW_DATA" && wc -l < clean.csv > lines.txt',
    )

    raw = extract()
    clean = transform(raw)
    load.override(task_id="load_report")(clean)
    checksum.expand(path=[raw, clean])
    clean >> count_lines
    broken(clean)
    summarize(stage(clean))
    call_tool(clean, passphrase="af-cnry-77e1d")


roar_etl()
