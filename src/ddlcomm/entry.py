"""The ``ddlcomm`` command's entry point: a Ctrl-C while the command line loads (NumPy,
the backends' modules: about a second) ends it as one during a run does, without a traceback."""
import sys


def main() -> int:
    try:
        from .cli import main as run    # lazy: the interrupt is caught while it loads
    except KeyboardInterrupt:
        print("ddlcomm: interrupted", file=sys.stderr)
        return 130
    return run()
