"""Export points to CSV and JSON (pure functions returning text).

Every record starts with :data:`CORE_FIELDS`, the documented minimum that
scripts may rely on (never renamed), then the other contract fields, then the
keys of the point's ``extra`` dict flattened to the top level.  Times are in
microseconds, bandwidths in GB/s (10^9 bytes per second), sizes in bytes.
"""
from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Iterable, Mapping

#: Columns every export has, in this order; never renamed.
CORE_FIELDS = ["run_id", "backend", "library", "collective", "form", "algorithm", "dtype", "op",
               "bytes", "ranks", "iterations", "t_min_us", "t_avg_us", "t_max_us", "t_p50_us",
               "t_p99_us", "algbw_GBps", "busbw_GBps", "check"]

#: The remaining contract fields of a point, after :data:`CORE_FIELDS`.
OTHER_FIELDS = ["library_version", "count", "root", "in_place", "warmup", "error"]


def point_record(point: Mapping[str, Any]) -> dict[str, Any]:
    """One flat record of ``point``: core fields, other contract fields, then extra's keys.

    Missing fields are None.  An ``extra`` key equal to a contract field does
    not overwrite it: it appears as ``extra.<key>`` instead.
    """
    rec = {name: point.get(name) for name in CORE_FIELDS + OTHER_FIELDS}
    for key, value in (point.get("extra") or {}).items():
        rec[f"extra.{key}" if key in rec else key] = value
    return rec


def strict(value: Any) -> Any:
    """Make ``value`` strict JSON: NaN/inf become None, NumPy values plain ones, sets sorted lists."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return [strict(v) for v in sorted(value)]
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def to_json(points: Iterable[Mapping[str, Any]]) -> str:
    """A JSON list of :func:`point_record` objects, indented by 2."""
    return json.dumps([strict(point_record(p)) for p in points], indent=2, default=str)


def _cell(value: Any) -> Any:
    """A CSV cell: None is empty, containers are JSON, everything else as is."""
    if value is None:
        return ""
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(strict(value), default=str)
    return value


def to_csv(points: Iterable[Mapping[str, Any]]) -> str:
    """CSV text with one row per point; the header is the union of every record's keys.

    Columns come in :func:`point_record` order (extra keys in the order first
    seen); a value a point lacks is an empty cell.
    """
    records = [point_record(p) for p in points]
    header: dict[str, None] = dict.fromkeys(CORE_FIELDS + OTHER_FIELDS)
    for rec in records:
        header.update(dict.fromkeys(rec))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(header), restval="", lineterminator="\n")
    writer.writeheader()
    for rec in records:
        writer.writerow({k: _cell(v) for k, v in rec.items()})
    return buf.getvalue()
