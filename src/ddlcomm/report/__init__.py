"""Reports: terminal tables, plots and one HTML page per run.

Importing this package is cheap: matplotlib is loaded only when a figure is
drawn (inside :mod:`ddlcomm.report.plots`).
"""
from __future__ import annotations

from .html import write_run_report
from .tables import (render_compare, render_points, render_run, render_runs, series_key,
                     varying_dimensions)

__all__ = ["render_points", "render_runs", "render_run", "render_compare", "series_key",
           "varying_dimensions", "write_run_report"]
