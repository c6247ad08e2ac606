"""The benchmark harness: timing protocol, statistics, sweep planning, the in-rank runner."""
