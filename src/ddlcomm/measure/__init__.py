"""The measuring layer: the timing protocol, statistics, checks and records that
``bench`` (collectives and the C reference), ``workloads`` and ``train`` share.

- :mod:`.timing`: per-call timing with a barrier before each call, the probe
  that chooses iterations and warm-up, per-phase loops, the np.add floor;
- :mod:`.stats`: per-point statistics and bandwidths, relative errors (pure);
- :mod:`.checks`: results compared with their expected values, verdicts agreed
  over ranks;
- :mod:`.calls`: a collective bound to its buffers (buffer form, object form,
  ddlcomm's own algorithms);
- :mod:`.records`: the stored record of one point.
"""
