"""Recording: the one path from a task's boundaries to its lineage, for every engine.

Producers (the `roar-core run` runner, a Ray worker, Snakemake's scheduler, an Airflow task
process) append a line to their own task log when a task begins and ends (`tasklog`); one
recorder process per session directory (`recorder`) follows the logs (`follower`) and
records each task once: tracer logs -> attribution -> classification -> hashing -> store
-> spool.
"""
