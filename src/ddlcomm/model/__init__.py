"""Performance models: calibrated α-β-γ collective costs and the S-SGD iteration model.

- :mod:`.costs`: the terms of every (collective, algorithm), :class:`~.costs.Params`, times
- :mod:`.library`: the algorithm each library runs by default (sources in its docstring)
- :mod:`.node`: what a node adds to a call's terms (its load: oversubscription, cache, copies at once, pages)
- :mod:`.calibrate`: robust (Huber) fits from stored points, residuals, holdout
- :mod:`.ssgd`: Shi and Chu's iteration model (no overlap, I/O prefetch, WFBP)
- :mod:`.predict`: a collective's time over sizes and rank counts; S-SGD aggregation priced by a fit

All pure: nothing here imports MPI, reads the store or draws (``report/model.py``
draws; ``cli/model.py`` is ``ddlcomm model calibrate|predict|ssgd|tune|report``).
"""
