"""``ddlcomm train``: synchronous data-parallel training of real networks, timed by phase.

``nets`` (the networks), ``data`` (synthetic batches, or files read ahead),
``device`` (the CPU or the rank's GPU), ``wire`` (what a backend is handed
for a bucket tensor), ``aggregate`` (gradient buckets; all-reduce with fusion and overlap, or a
parameter server, through any ddlcomm Communicator), ``sgd`` (the optimizer, torch's
arithmetic without torch.optim), ``loop`` (one
configuration in the ranks: timed phases, checks, records), ``ddp`` (torch
DistributedDataParallel as the peer), ``phases``/``scaling`` (the pure
arithmetic), ``predict`` (the S-SGD model on the measurements), ``config``
(a configuration, a job, and the checks of the options that make them),
``session`` (owning a run).  The options are parsed in ``cli/train.py``.
"""
