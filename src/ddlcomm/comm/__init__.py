"""ddlcomm.comm: one Communicator interface over several backends."""
from .base import Communicator
from .registry import BACKENDS, check, create

__all__ = ["Communicator", "BACKENDS", "check", "create"]
