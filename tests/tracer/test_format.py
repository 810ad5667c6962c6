"""The log format is described once, in roar_log.h: check the Python reader agrees with
it (sizes, field offsets, op codes, flags), so the two cannot drift apart."""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

from roar_core.pipeline import tracelog

HEADER = Path(__file__).resolve().parents[2] / "tracer-bins" / "preload" / "roar_log.h"

PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include "roar_log.h"
#define OFF(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f))
int main(void) {
    printf("sizeof.record %zu\n", sizeof(struct roar_record));
    printf("sizeof.header %zu\n", sizeof(struct roar_log_header));
    OFF(roar_log_header, version); OFF(roar_log_header, origin); OFF(roar_log_header, pid);
    OFF(roar_log_header, ppid); OFF(roar_log_header, start_mono_ns);
    OFF(roar_log_header, start_wall_ns); OFF(roar_log_header, reserved);
    OFF(roar_log_header, dropped); OFF(roar_log_header, flags);
    OFF(roar_record, op); OFF(roar_record, state); OFF(roar_record, pid);
    OFF(roar_record, ppid); OFF(roar_record, tid); OFF(roar_record, err);
    OFF(roar_record, result); OFF(roar_record, flags); OFF(roar_record, mode);
    OFF(roar_record, fd); OFF(roar_record, rflags); OFF(roar_record, mono_ns);
    OFF(roar_record, wall_ns); OFF(roar_record, st_dev); OFF(roar_record, st_ino);
    OFF(roar_record, st_size); OFF(roar_record, st_mtime_ns); OFF(roar_record, st_ctime_ns);
    OFF(roar_record, tag_len); OFF(roar_record, path_len); OFF(roar_record, path2_len);
    return 0;
}
"""

# Offsets implied by the reader's struct formats, in field order.
RECORD_FIELDS = ["size", "op", "state", "pid", "ppid", "tid", "err", "result", "flags", "mode",
                 "fd", "rflags", "mono_ns", "wall_ns", "st_dev", "st_ino", "st_size",
                 "st_mtime_ns", "st_ctime_ns", "tag_len", "path_len", "path2_len", "_pad"]
HEADER_FIELDS = ["magic", "version", "header_size", "chunk_size", "origin", "pid", "ppid",
                 "start_mono_ns", "start_wall_ns", "reserved", "dropped", "flags", "_pad"]


def offsets(fmt: str, names: list[str]) -> dict[str, int]:
    out, off = {}, 0
    for name, code in zip(names, re.findall(r"\d*[a-zA-Z]", fmt[1:]), strict=True):
        out[name] = off
        off += struct.calcsize("<" + code)
    return out


def test_struct_layout_matches_header(tmp_path):
    src = tmp_path / "probe.c"
    src.write_text(PROBE)
    exe = tmp_path / "probe"
    subprocess.run(["cc", "-I", str(HEADER.parent), "-o", str(exe), str(src)], check=True)
    c = dict(line.rsplit(" ", 1) for line in subprocess.check_output([str(exe)], text=True)
             .splitlines())
    c = {k: int(v) for k, v in c.items()}
    assert c["sizeof.record"] == tracelog.RECORD_FIXED == tracelog._RECORD.size
    assert c["sizeof.header"] == tracelog._HEADER.size
    rec = offsets(tracelog._RECORD.format, RECORD_FIELDS)
    hdr = offsets(tracelog._HEADER.format, HEADER_FIELDS)
    for key, value in c.items():
        kind, field = key.split(".")
        if kind == "roar_record":
            assert rec[field] == value, field
        elif kind == "roar_log_header":
            assert hdr[field] == value, field


def defines(prefix: str) -> dict[str, int]:
    text = HEADER.read_text()
    out = {}
    for name, value in re.findall(rf"#define {prefix}(\w+)\s+(0x[0-9a-fA-F]+|\d+)u?", text):
        out[name] = int(value, 0)
    return out


def test_constants_match_header():
    ops = {k.lower(): v for k, v in defines("ROAR_OP_").items() if k != "MAX"}
    assert ops == tracelog.OP
    from roar_core.pipeline import s3trace  # keeps its own copies: it loads at every start

    for name, value in defines("ROAR_OBJ_").items():
        assert getattr(tracelog, f"OBJ_{name}") == value, name
        if hasattr(s3trace, f"OBJ_{name}"):
            assert getattr(s3trace, f"OBJ_{name}") == value, name
    for name, value in defines("ROAR_RF_").items():
        assert getattr(tracelog, f"RF_{name}") == value, name
    scalars = defines("ROAR_")
    assert scalars["LOG_VERSION"] == tracelog.VERSION
    assert scalars["HEADER_SIZE"] == tracelog.HEADER_SIZE
    assert scalars["STATE_RESERVED"] == tracelog.STATE_RESERVED
    assert scalars["STATE_COMMITTED"] == tracelog.STATE_COMMITTED
    assert scalars["ORIGIN_EXEC"] == tracelog.ORIGIN_EXEC
    assert scalars["ORIGIN_FORK"] == tracelog.ORIGIN_FORK
    # ROAR_CHUNK is an expression, not a literal.
    assert "#define ROAR_CHUNK (256u * 1024u)" in HEADER.read_text()
    assert tracelog.CHUNK == 256 * 1024
