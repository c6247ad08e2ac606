"""Tests of CSV/JSON export."""
from __future__ import annotations

import csv
import io
import json

from ddlcomm.results.export import CORE_FIELDS, OTHER_FIELDS, point_record, to_csv, to_json


def point(nbytes: int, **extra) -> dict:
    return dict(run_id=1, backend="mpi", library="MPICH", library_version="4.2",
                collective="bcast", form="buffer", algorithm="library", dtype="uint8", op=None,
                bytes=nbytes, count=nbytes, ranks=3, root=0, in_place=False, iterations=10,
                warmup=2, t_min_us=1.0, t_avg_us=1.5, t_max_us=2.0, t_p50_us=1.5, t_p99_us=2.0,
                algbw_GBps=0.25, busbw_GBps=0.25, check="passed", error=None, extra=extra)


def test_point_record_order_and_extra():
    rec = point_record(point(8, phase="bwd", bytes=99, memory={"kind": "host"}))
    keys = list(rec)
    assert keys[:len(CORE_FIELDS)] == CORE_FIELDS
    assert keys[len(CORE_FIELDS):len(CORE_FIELDS) + len(OTHER_FIELDS)] == OTHER_FIELDS
    assert keys[-3:] == ["phase", "extra.bytes", "memory"]
    assert rec["bytes"] == 8 and rec["extra.bytes"] == 99       # never overwritten
    assert "extra" not in rec


def test_json_has_core_fields():
    data = json.loads(to_json([point(4), point(8, phase="fwd", t=float("nan"))]))
    assert len(data) == 2
    for rec in data:
        assert set(CORE_FIELDS) <= set(rec)
    assert data[0]["op"] is None and data[1]["phase"] == "fwd" and data[1]["t"] is None
    assert json.loads(to_json([])) == []


def test_csv_union_header_and_empty_cells():
    text = to_csv([point(4), point(8, phase="fwd", memory={"kind": "host"})])
    rows = list(csv.DictReader(io.StringIO(text)))
    header = text.splitlines()[0].split(",")
    assert header == CORE_FIELDS + OTHER_FIELDS + ["phase", "memory"]
    assert rows[0]["phase"] == "" and rows[0]["op"] == "" and rows[0]["bytes"] == "4"
    assert rows[1]["phase"] == "fwd" and json.loads(rows[1]["memory"]) == {"kind": "host"}
    assert float(rows[1]["busbw_GBps"]) == 0.25
    assert to_csv([]).strip() == ",".join(CORE_FIELDS + OTHER_FIELDS)
