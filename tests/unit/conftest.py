"""Hypothesis settings of the unit tests: deterministic examples, so CI sees the same cases,
and no shrinking (a failing case of test_bad_input.py may be a command that ran: it is
reported as generated, not run again and again)."""
from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "ddlcomm", derandomize=True, phases=[Phase.explicit, Phase.generate], deadline=None, database=None, print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                           HealthCheck.filter_too_much])
settings.load_profile("ddlcomm")
