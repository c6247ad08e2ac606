"""The benchmark harness (``ddlcomm bench``): the plan of points, the ranks' run and its
record, the in-rank runner and the C reference; timing and statistics are in ``measure/``."""
