"""A log filter for what any client can make gRPC log."""

from __future__ import annotations

import logging
import time

#: what gRPC says of a request body it cannot parse (``grpc._common``)
SPARED = "Exception deserializing"


class Sparing(logging.Filter):
    """Of the records that begin with ``SPARED``, lets the first ``burst`` through
    whole, then one line a minute that says how many were held back: gRPC logs a
    traceback for every request body it cannot parse, which any client that reaches the
    port can send. Everything else passes."""

    def __init__(self, burst: int = 5, every: float = 60.0):
        super().__init__()
        self.burst, self.every, self.held, self.last = burst, every, 0, -every

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(SPARED):
            return True
        if self.burst > 0:
            self.burst -= 1
            return True
        now = time.monotonic()
        if now - self.last < self.every:
            self.held += 1
            return False
        record.msg = (f"{record.getMessage()} ({self.held} more like it held back in the "
                      "last minute)" if self.held else f"{record.getMessage()} (more like "
                      "it are held back: one line a minute)")
        record.args, record.exc_info, record.exc_text = None, None, None
        self.last, self.held = now, 0
        return True
