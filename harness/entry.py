"""The ``qaina-bench`` command: Ctrl-C while its command line loads (the imports take
a second or two on a busy machine) ends it with one line and status 130, as Ctrl-C
does once a command runs (``cli.Main``)."""

from __future__ import annotations

import sys


def main():
    try:
        from .cli import main as command
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        sys.exit(130)
    command()
