"""Mininet's own log while a testbed is up: to a file of the run, not the terminal,
and tc's refusals (Mininet logs them and leaves the link unshaped) kept to fail on."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

from mininet.log import lg


class LinkError(OSError):
    """A link the kernel did not shape as the run asked (tc refused a command)."""


class MininetLog:
    """Mininet's own messages go to ``path`` while a testbed is up, not to the terminal
    (tc's warnings at high link rates would break a run's progress lines); its error
    messages are kept in ``errors``."""

    def __init__(self, path: Path):
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(logging.Formatter("%(message)s"))
        self.errors: list[str] = []
        self.collector = logging.Handler(logging.ERROR)
        self.collector.emit = lambda record: self.errors.append(record.getMessage().strip())
        self.quieted = [(h, h.level) for h in lg.handlers]
        for h, _ in self.quieted:
            h.setLevel(logging.CRITICAL)
        lg.addHandler(self.handler)
        lg.addHandler(self.collector)

    def tc_failures(self) -> list[str]:
        """What tc said when it refused a command that shapes a link (its warnings,
        e.g. htb's quantum at high rates, are not failures)."""
        out = []
        for message in self.errors:
            said = message.removeprefix("*** Error:").strip()
            if message.startswith("*** Error:") and said and not said.startswith("Warning"):
                out.append(said)
            elif "is outside supported range" in message:
                out.append(message)
        return out

    @contextmanager
    def terminal(self):
        """Mininet's messages reach the terminal too in the block (its CLI prints
        through them)."""
        for h, level in self.quieted:
            h.setLevel(level)
        try:
            yield
        finally:
            for h, _ in self.quieted:
                h.setLevel(logging.CRITICAL)

    def close(self):
        lg.removeHandler(self.handler)
        lg.removeHandler(self.collector)
        self.handler.close()
        for h, level in self.quieted:
            h.setLevel(level)
