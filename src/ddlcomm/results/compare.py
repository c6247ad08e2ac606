"""Compare the points of two runs (pure).

Points are matched on :data:`KEY_FIELDS` plus :data:`EXTRA_KEYS` (a workload's or a
data path's ``phase``, the data ``path``: host unless a point names one, and a training
configuration's own keys); each match gives one row with both average times (in
microseconds), their ratio, whether that ratio is within the two points' own
noise (:func:`within_noise`) and both bus bandwidths (GB/s).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from ..pages import senders_huge_share

#: Point fields that identify "the same measurement" in two runs.
#: The library is not part of the key: comparing a run under Open MPI with one
#: under MPICH is the point of many comparisons (each run's header names it).
KEY_FIELDS = ("backend", "collective", "form", "algorithm", "dtype", "op",
              "bytes", "ranks", "in_place")

#: Fields of a point's ``extra`` that are part of its key, with their value where it has
#: none: one run may measure the same collective along several data paths
#: (``--path host-staged,nccl-chief``), each with its phases, and ``ddlcomm train`` several
#: configurations in one run (``--arch allreduce,ps``, ``--overlap both``, ``--wait both``,
#: ``--peer ddp``, ``--batch-sweep``): bench's points have none of those.
EXTRA_KEYS = {"path": "host", "phase": None, "model": None, "arch": None, "peer": None,
              "overlap": None, "wait": None, "fusion": None, "batch": None, "device": None}

# Row order: by collective, form, ..., and message size last.
_SORT_FIELDS = ("collective", "form", "backend", "algorithm", "dtype", "op",
                "ranks", "in_place", *EXTRA_KEYS, "bytes")


def _key(point: Mapping[str, Any]) -> tuple:
    extra = point.get("extra") or {}
    return tuple(point.get(f) for f in KEY_FIELDS) + tuple(extra.get(k, v) for k, v in EXTRA_KEYS.items())


def _index(points: Iterable[Mapping[str, Any]]) -> dict[tuple, Mapping[str, Any]]:
    """Points by key; of several points with one key the last wins."""
    return {_key(p): p for p in points}


def _order(value: Any) -> tuple:
    """Sort None first, then numbers, then strings, so no two kinds meet."""
    if value is None:
        return (0, 0, "")
    if isinstance(value, (int, float)):
        return (1, 0, value)
    return (1, 1, str(value))


def _sort_key(row: Mapping[str, Any]) -> tuple:
    return tuple(_order(row[f]) for f in _SORT_FIELDS)


def within_noise(a: Mapping[str, Any], b: Mapping[str, Any]) -> Optional[bool]:
    """Whether two points' difference is within their own spread: their
    p50..p99 ranges overlap, so the ratio B/A of 1 (no difference) lies inside
    what the ranges allow (from ``p50_b / p99_a`` to ``p99_b / p50_a``).

    None when a side lacks its p50 or p99.
    """
    lo_a, hi_a, lo_b, hi_b = (p.get(k) for p in (a, b) for k in ("t_p50_us", "t_p99_us"))
    if None in (lo_a, hi_a, lo_b, hi_b):
        return None
    return max(lo_a, lo_b) <= min(max(hi_a, lo_a), max(hi_b, lo_b))


def compare(points_a: Iterable[Mapping[str, Any]],
            points_b: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Match the points of run A and run B and compare their times.

    Each row holds the key fields, ``phase`` (None unless the points have
    ``extra['phase']``), ``path`` (host unless ``extra['path']`` names another) and a
    training configuration's keys (:data:`EXTRA_KEYS`), ``t_avg_us_a``/``_b`` (microseconds), ``ratio`` =
    ``t_avg_us_b / t_avg_us_a`` (above 1: B is slower; None when either time
    is missing or A's is 0), ``ratio_p50`` the same of the medians (an average that
    a few slow iterations pulled away from its median shows against it), ``noise`` (:func:`within_noise`: True when the
    difference is within the points' own p50..p99 spread, None when unknown),
    ``busbw_GBps_a``/``_b``, ``check_a``/``_b`` and ``huge_a``/``_b``, the part of the
    arrays the data came from on huge pages where the points recorded it
    (:func:`ddlcomm.pages.senders_huge_share`: an MPI's single copy costs several
    times more from small pages, so a ratio where they differ may be the pages).
    A key measured on one side only still gets a row, the other side None.
    Rows are sorted by collective, form, backend, algorithm, dtype,
    op, ranks, in_place, :data:`EXTRA_KEYS` and bytes.
    """
    a, b = _index(points_a), _index(points_b)
    rows = []
    for key in list(a) + [k for k in b if k not in a]:
        pa, pb = a.get(key, {}), b.get(key, {})
        row: dict[str, Any] = dict(zip(KEY_FIELDS + tuple(EXTRA_KEYS), key))
        ta, tb = pa.get("t_avg_us"), pb.get("t_avg_us")
        row["t_avg_us_a"], row["t_avg_us_b"] = ta, tb
        row["ratio"] = tb / ta if ta and tb is not None else None
        ma, mb = pa.get("t_p50_us"), pb.get("t_p50_us")
        row["ratio_p50"] = mb / ma if ma and mb is not None else None
        row["noise"] = within_noise(pa, pb)
        row["busbw_GBps_a"], row["busbw_GBps_b"] = pa.get("busbw_GBps"), pb.get("busbw_GBps")
        row["check_a"], row["check_b"] = pa.get("check"), pb.get("check")
        row["huge_a"], row["huge_b"] = senders_huge_share(pa), senders_huge_share(pb)
        rows.append(row)
    rows.sort(key=_sort_key)
    return rows


def unmatched(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Where two runs' points never meet (pure): the key fields whose values differ wholly
    between the points of A and of B (``ranks``: 2 against 3), or ``[]`` if some row has both
    sides or a side has no points."""
    rows = list(rows)
    if any(r["t_avg_us_a"] is not None and r["t_avg_us_b"] is not None for r in rows):
        return []
    side_a = [r for r in rows if r["t_avg_us_a"] is not None]
    side_b = [r for r in rows if r["t_avg_us_b"] is not None]
    if not side_a or not side_b:
        return []
    return [f for f in KEY_FIELDS + tuple(EXTRA_KEYS)
            if not {r[f] for r in side_a} & {r[f] for r in side_b}]

