"""A Ray Data pipeline: its streaming generator tasks, and pyarrow's writes from its own
threads, are lineage of the runs that did them."""

from __future__ import annotations

import os

import pytest

from tests.integrations.ray.helpers import digest, io_of

if os.environ.get("ROAR_TEST_REQUIRE_RAY") != "1":
    pytest.importorskip("pyarrow")
    pytest.importorskip("pandas")


def _double(batch):
    batch["y"] = batch["x"] * 2
    return batch


def test_read_csv_map_batches_write_parquet(ray_job):
    import ray.data

    src, dst = ray_job.data / "csv", ray_job.data / "parquet"
    src.mkdir()
    csvs = []
    for i in range(3):
        p = src / f"part{i}.csv"
        p.write_text("x\n" + "".join(f"{i * 100 + j}\n" for j in range(50)))
        csvs.append(str(p))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    (ray.data.read_csv(str(src), override_num_blocks=3)
        .map_batches(_double, batch_format="pandas")
        .write_parquet(str(dst)))
    written = sorted(str(p) for p in dst.glob("*.parquet"))
    assert written
    ray_job.finish()

    store = ray_job.store()
    producers = {}
    for r in ray_job.runs(store):
        ins, outs = io_of(store, r.run_id)
        for path, d in outs.items():
            if path.endswith(".parquet"):
                assert path not in producers, f"{path} written by two runs"
                producers[path] = (r, ins, d)
    assert sorted(producers) == written
    for path, (run, ins, d) in producers.items():
        assert run.status == "COMPLETE" and run.traced
        assert d == digest(path)
        assert set(ins) <= set(csvs) and ins, (run.job_name, ins)
        assert all(ins[c] == digest(c) for c in ins)
    # Every CSV file was read by a run that wrote parquet.
    assert set().union(*(ins for _, ins, _ in producers.values())) == set(csvs)
