"""Which node a rank runs on, as the algorithms that treat one node apart tell it."""
from __future__ import annotations

import os
import socket


def node_name() -> str:
    """This rank's node: ``$DDLCOMM_NODE`` when set, else the host name."""
    return os.environ.get("DDLCOMM_NODE") or socket.gethostname()
