"""What the S3 tracer adds to a boto3 call, against moto's server on loopback.

    python bench/bench_s3.py [--batches 20] [--calls 50] [--json OUT]

1. Per call: put_object and get_object(...).read() of a 64 KiB and an 8 MiB object, in one
   traced client process (the shim preloaded, the hook installed), in batches with the
   hook's handlers registered on the client ("hook on") or not ("off"), interleaved, so
   both see the same warm process and connection.  (The shim itself adds nothing to a
   call: botocore opens no file per call.)  The figure is the client's CPU time per call
   (the server is another process); wall time beside it.  Added per call = on - off; the
   budget is 50 us plus hashing the body, so the hashing (blake3, one thread, the same
   bytes, measured in the same run) is subtracted to compare.
2. Hashing a streamed body: an 8 MiB GetObject body (botocore's StreamingBody over a
   urllib3 response) read whole and in 1 KiB to 256 KiB chunks, with and without the hook's
   hashing stream; the time it adds versus blake3's single-thread speed on the same bytes.
3. Interpreter start-up added by the hook: `python -c pass` with ROAR_SESSION_DIR set (the
   .pth installs the import watch) versus unset (the .pth only reads the environment).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import results  # noqa: E402

SIZES = {"64 KiB": 64 << 10, "8 MiB": 8 << 20}
# Server and client on CPUs of their own (where there are two): less scheduler noise in a
# difference of tens of microseconds per call.
_CPUS = sorted(os.sched_getaffinity(0))
PIN_SERVER = ["taskset", "-c", str(_CPUS[0])] if len(_CPUS) > 1 else []
PIN_CLIENT = ["taskset", "-c", str(_CPUS[-1])] if len(_CPUS) > 1 else []

WORKER = r"""
import io, json, os, sys, time
import boto3
from roar_core.pipeline import s3trace
calls, batches, sizes = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
s3 = boto3.client("s3")
spent = [0.0]  # seconds inside the handlers (on batches)

def timed(fn):
    def handler(*args, **kwargs):
        t = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - t
    return handler

HANDLERS = [("before-parameter-build.s3", timed(s3trace._params)),
            ("before-call.s3", timed(s3trace._request)), ("after-call.s3", timed(s3trace._done))]
assert s3trace._shim is not None, "the hook is not installed in this traced process"

def hook(on):
    for event, fn in HANDLERS:
        (s3.meta.events.register if on else s3.meta.events.unregister)(event, fn)

hook(False)  # the client got them at creation; from here they come and go per batch
out = {}
for label, size in sizes.items():
    data = os.urandom(size)
    n = calls if size < (1 << 20) else max(5, calls // 20)
    s3.put_object(Bucket="bench", Key=label, Body=data)  # warm: connection, models
    s3.get_object(Bucket="bench", Key=label)["Body"].read()
    for op in ("put", "get"):
        got = {"off": [], "on": [], "handlers": []}
        for b in range(batches):
            for variant in (("off", "on") if b % 2 else ("on", "off")):
                hook(variant == "on")
                c0, w0, s0 = time.process_time(), time.perf_counter(), spent[0]
                for _ in range(n):
                    if op == "put":
                        s3.put_object(Bucket="bench", Key=label, Body=data)
                    else:
                        body = s3.get_object(Bucket="bench", Key=label)["Body"]
                        assert len(body.read()) == size
                got[variant].append(((time.process_time() - c0) / n,
                                     (time.perf_counter() - w0) / n))
                if variant == "on":
                    got["handlers"].append((spent[0] - s0) / n)
                hook(False)
        out[f"{op} {label}"] = got
stream = {}
import blake3, urllib3
from botocore.response import StreamingBody
data = os.urandom(8 << 20)
def best(fn, reps=15):
    times = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)
class Timed(s3trace._HashingStream):
    spent = [0.0]  # seconds inside the stream's hashing (update, count, digest)

    def _hash(self, data):
        t = time.perf_counter()
        super()._hash(data)
        Timed.spent[0] += time.perf_counter() - t
def body(hashed):
    # botocore's StreamingBody over a urllib3 response, as a GetObject hands it out (the
    # bytes from memory instead of a socket: what is timed is the reading and hashing)
    raw = urllib3.response.HTTPResponse(body=io.BytesIO(data), preload_content=False,
                                        headers={"content-length": str(len(data))})
    b = StreamingBody(raw, len(data))
    if hashed:
        b._raw_stream = Timed(b._raw_stream, "s3://bench/x", {}, len(data))
    return b
stream["blake3 one thread"] = best(lambda: blake3.blake3(data).digest())
s3trace._emit = lambda *args: None  # the digest record: not part of the hashing
for how, read in (("read()", lambda b: b.read()),
                  ("iter_chunks(1 KiB)", lambda b: [*b.iter_chunks(1 << 10)]),
                  ("iter_chunks(16 KiB)", lambda b: [*b.iter_chunks(16 << 10)]),
                  ("iter_chunks(64 KiB)", lambda b: [*b.iter_chunks(64 << 10)]),
                  ("iter_chunks(256 KiB)", lambda b: [*b.iter_chunks(256 << 10)])):
    plain = best(lambda: read(body(False)))
    Timed.spent[0] = 0.0
    hashed = best(lambda: read(body(True)))
    stream[how] = (plain, hashed, Timed.spent[0] / 15)
print(json.dumps({"calls": out, "stream": stream}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([*PIN_SERVER, sys.executable, "-m", "moto.server", "-H",
                             "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("moto's server did not start") from None
            time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=40, help="on/off batches per call kind")
    ap.add_argument("--calls", type=int, default=100, help="64 KiB calls per batch")
    ap.add_argument("--starts", type=int, default=100, help="interpreter starts per variant")
    ap.add_argument("--json", help="write the raw numbers here (bench/report)")
    args = ap.parse_args()

    from roar_core.pipeline import tracer

    port = free_port()
    moto = start_moto(port)
    tmp = Path(tempfile.mkdtemp(prefix="roar-bench-s3-"))
    worker = tmp / "worker.py"
    worker.write_text(WORKER)
    base = {k: v for k, v in os.environ.items() if not k.startswith("ROAR_")
            and k != "LD_PRELOAD"}
    base.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL_S3=f"http://127.0.0.1:{port}")
    try:
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                     aws_access_key_id="bench", aws_secret_access_key="bench"
                     ).create_bucket(Bucket="bench")
        (tmp / "session").mkdir()
        cmd = [*PIN_CLIENT, sys.executable, str(worker), str(args.calls), str(args.batches),
               json.dumps(SIZES)]
        out = subprocess.run(cmd, env=tracer.preload_env(tmp / "session", base=base),
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"worker failed: {out.stderr[-2000:]}")
        got = json.loads(out.stdout)
    finally:
        moto.terminate()
        moto.wait(10)

    import blake3

    scenarios = []
    print(f"1. per call, client CPU (wall), medians of {args.batches} interleaved batches "
          "in one traced process, the hook's handlers on or off")
    print("   hashing: blake3, one thread, of the same size, in the caches / not (a body "
          "comes off the network into a fresh buffer: in between); handlers: CPU inside "
          "the hook's handlers (a PUT's hashing included; a GET's is in its read)")
    print(f"   {'call':<12} {'hook off':>18} {'hook on':>18} {'added':>9} {'noise':>7} "
          f"{'hashing hot/cold':>17} {'handlers':>9}")
    evict = bytearray(64 << 20)
    for op, by in got["calls"].items():
        size = SIZES[op.split(" ", 1)[1]]
        hot, cold = [], []
        for _ in range(7):
            data = os.urandom(size)
            hot.append(_timed(lambda d=data: blake3.blake3(d).digest()))
            evict[::4096] = bytes(len(evict[::4096]))  # push `data` out of the caches
            cold.append(_timed(lambda d=data: blake3.blake3(d).digest()))
        h, hc = statistics.median(hot), statistics.median(cold)
        off_c, on_c = (statistics.median(c for c, _ in by[v]) for v in ("off", "on"))
        off_w, on_w = (statistics.median(w for _, w in by[v]) for v in ("off", "on"))
        added = on_c - off_c
        q = statistics.quantiles([c for c, _ in by["off"]], n=4)
        noise = (q[2] - q[0]) / 2  # half the spread of one batch's figure
        print(f"   {op:<12} {off_c * 1e3:7.3f} ({off_w * 1e3:6.2f}) ms "
              f"{on_c * 1e3:7.3f} ({on_w * 1e3:6.2f}) ms {added * 1e6:6.0f} us "
              f"+-{noise * 1e6:3.0f} {h * 1e6:6.0f} /{hc * 1e6:5.0f} us "
              f"{statistics.median(by['handlers']) * 1e6:6.1f} us")
        scenarios.append(results.scenario(
            f"S3 {op}: client CPU per call", "ms",
            ("hook off", [c * 1e3 for c, _ in by["off"]]),
            [("hook on", [c * 1e3 for c, _ in by["on"]])],
            note=f"hashing {size} bytes with blake3 (one thread): {h * 1e3:.3f} ms"))
    stream = got["stream"]
    b3 = stream.pop("blake3 one thread")
    print(f"2. an 8 MiB body read through botocore and urllib3, plain and hashed by the hook; "
          f"blake3 one thread on the bytes in memory: {(8 << 20) / b3 / 1e9:.2f} GB/s "
          f"({b3 * 1e3:.2f} ms).  Hashing speed: the body's bytes over the time spent in the "
          "stream's hashing; added: hashed read - plain read (fresh buffers, cache effects)")
    for how, (plain, hashed, spent) in stream.items():
        added = hashed - plain
        print(f"   {how:<22} hashing {(8 << 20) / spent / 1e9:5.2f} GB/s = "
              f"{b3 / spent * 100:3.0f} % of blake3; read: plain {plain * 1e3:6.2f} ms, hashed "
              f"{hashed * 1e3:6.2f} ms, added {added * 1e3:+6.2f} ms")
    starts: dict[str, list[float]] = {"unset": [], "set": []}
    env_set = {**base, "ROAR_SESSION_DIR": str(tmp / "unused")}
    for _ in range(args.starts):
        for k, env in (("unset", base), ("set", env_set)):
            starts[k].append(_timed(lambda env=env: subprocess.run(
                [sys.executable, "-c", "pass"], env=env, check=True)))
    off, on = statistics.median(starts["unset"]), statistics.median(starts["set"])
    print(f"3. interpreter start-up (median of {args.starts}): {off * 1e3:.2f} ms without the "
          f"hook, {on * 1e3:.2f} ms with it: +{(on - off) * 1e3:.2f} ms (fastest: "
          f"+{(min(starts['set']) - min(starts['unset'])) * 1e3:.2f} ms)")
    scenarios.append(results.scenario(
        "Python start-up with the S3 hook", "ms",
        ("ROAR_SESSION_DIR unset", [s * 1e3 for s in starts["unset"]]),
        [("set (hook installed)", [s * 1e3 for s in starts["set"]])]))
    results.write(args.json, "s3", "S3 tracer: per call and start-up", scenarios)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
