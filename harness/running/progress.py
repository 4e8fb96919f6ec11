"""The progress line of a run: rewritten in place on a terminal; where the output is a
file or a pipe (a log, CI), a line of its own at most every ``EVERY`` seconds, so that a
long run's log does not fill with ten lines a second."""

from __future__ import annotations

import sys
import time

#: seconds between progress lines when the output is no terminal
EVERY = 10.0


def _terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced, or closed
        return False


class Progress:
    """Shows ``line`` through ``echo(text, nl=...)`` (click's or print-like)."""

    def __init__(self, echo, terminal: bool | None = None, every: float = EVERY):
        self.echo = echo
        self.terminal = _terminal() if terminal is None else terminal
        self.every = every
        self.shown = ""  # the last line given
        self.written = ""  # the last line written (not on a terminal: every ``every`` s)
        self.at = float("-inf")

    def show(self, line: str):
        if line == self.shown:
            return
        self.shown = line
        if self.terminal:
            self.echo("\r" + line, nl=False)
        elif time.monotonic() - self.at >= self.every:
            self._write(line)

    def say(self, line: str):
        """A line of its own; on a terminal the progress line is drawn again under it."""
        if self.terminal and self.shown:
            self.echo("\r" + line.ljust(len(self.shown)))  # over the progress line
            self.echo("\r" + self.shown, nl=False)
        else:
            self.echo(line)

    def end(self):
        """The line ends (a terminal's) or the last one is written (elsewhere)."""
        if self.terminal:
            self.echo("")
        elif self.shown != self.written:
            self._write(self.shown)

    def _write(self, line: str):
        self.echo(line.lstrip("\r"))
        self.written, self.at = line, time.monotonic()
