"""Part 2 of the demo: a Ray job that reads the Snakemake workflow's output.

One Ray task per station file writes a summary of it; a last task reads the summaries and
writes report.json.  Started as `roar-core exec -- python analyze.py ...`: roar is attached
to the Ray cluster this driver starts, and `runtime_env={"roar": {}}` traces every task of
the job.
"""

import json
import os
import statistics
import sys

import ray


@ray.remote
def summarise(path: str) -> str:
    with open(path) as f:
        temps = [float(line.split(",")[1]) for line in f]
    out = os.path.join("summary", os.path.basename(path).replace(".csv", ".json"))
    with open(out, "w") as f:
        json.dump({"station": os.path.basename(path)[:-4], "hours": len(temps),
                   "mean": round(statistics.fmean(temps), 2), "max": max(temps)}, f)
    return out


@ray.remote
def report(summaries: list[str], out: str) -> str:
    stations = []
    for path in summaries:
        with open(path) as f:
            stations.append(json.load(f))
    with open(out, "w") as f:
        json.dump({"stations": stations}, f, indent=2)
        f.write("\n")
    return out


def main() -> None:
    files, out = sys.argv[1:-1], sys.argv[-1]
    os.makedirs("summary", exist_ok=True)
    # A cluster of its own ("local"), not one this machine may already run.
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"roar": {}}, log_to_driver=False)
    summaries = ray.get([summarise.remote(p) for p in files])
    print(ray.get(report.remote(summaries, out)))
    ray.shutdown()


if __name__ == "__main__":
    main()
