"""The embedded switch's receive coalescing: frames that trickle in are read in
bursts (``p4/embedded/loop.py``) when ``--coalesce-us`` / ``QAINA_SWITCH_COALESCE``
asks for it, and not by default."""

from __future__ import annotations

import json
import re
import time

import pytest

from conftest import SwitchLab

FRAMES = 300


def trickle(tmp_path, env: dict) -> tuple[dict, int]:
    """Send ``FRAMES`` frames into port 1 of a live embedded switch one at a time,
    0.1 ms apart; (port 1's stats, the coalescing waits its log counts)."""
    lab = SwitchLab("embedded", 2, tmp_path, env=env)
    port1 = lab.veths.pairs[1][0]
    try:
        lab.reset()  # a pipeline: its drop counter says when every frame was taken
        frame = bytes(6) + bytes.fromhex("020000000001") + b"\x88\xb5" + bytes(50)
        host = lab.hosts[1]
        for _ in range(FRAMES):
            host.send(frame)
            time.sleep(0.0001)
        # until the switch has taken them (drop reason 0: not a frame it routes); the
        # stats it writes when it stops count only what it read
        deadline = time.monotonic() + 30
        while (lab.counters("MyIngress.drops")[0][0] < FRAMES
               and time.monotonic() < deadline):
            time.sleep(0.05)
    finally:
        lab.close()
    stats = json.loads(lab.target.stats_path.read_text())
    waits = re.findall(r"(\d+) coalescing waits", lab.target.log_path.read_text())
    return stats[port1], int(waits[-1])


@pytest.mark.root
def test_frames_that_trickle_in_are_read_in_bursts(tmp_path):
    port, waits = trickle(tmp_path, {"QAINA_SWITCH_COALESCE": "2000"})
    assert port["rx"] >= FRAMES * 0.9  # a stray frame or two may be the kernel's own
    assert waits > 0
    assert port["rx_reads"] <= port["rx"] / 2, port  # one read per frame without it


@pytest.mark.root
def test_the_switch_does_not_coalesce_by_default(tmp_path):
    port, waits = trickle(tmp_path, {})
    assert port["rx"] >= FRAMES * 0.9 and waits == 0
