"""The progress line: in place on a terminal, a line every few seconds elsewhere."""

from __future__ import annotations

from qaina_bench.harness.running.progress import Progress


def _recorder():
    out = []
    return out, lambda text="", nl=True: out.append((text, nl))


def test_on_a_terminal_the_line_is_rewritten_in_place():
    out, echo = _recorder()
    p = Progress(echo, terminal=True)
    for line in ("a 1", "a 1", "a 2"):
        p.show(line)
    p.end()
    assert out == [("\ra 1", False), ("\ra 2", False), ("", True)]


def test_elsewhere_a_line_at_most_every_few_seconds_and_the_last_one_at_the_end():
    out, echo = _recorder()
    p = Progress(echo, terminal=False, every=3600)
    for i in range(1000):
        p.show(f"iterations {i}/1000")
    p.end()
    assert out == [("iterations 0/1000", True), ("iterations 999/1000", True)]
    out.clear()
    p = Progress(echo, terminal=False, every=0)
    p.show("x")
    p.show("y")
    p.end()  # nothing again: the last line is out already
    assert out == [("x", True), ("y", True)]


def test_a_line_said_meanwhile_goes_over_the_progress_line_which_is_drawn_again():
    out, echo = _recorder()
    p = Progress(echo, terminal=True)
    p.say("before any progress")
    p.show("iterations 3/12  ( 10.0 s)")
    p.say("  link x")
    p.end()
    assert out == [("before any progress", True), ("\riterations 3/12  ( 10.0 s)", False),
                   ("\r  link x".ljust(len("\riterations 3/12  ( 10.0 s)")), True),
                   ("\riterations 3/12  ( 10.0 s)", False), ("", True)]
    out.clear()
    p = Progress(echo, terminal=False, every=3600)
    p.show("iterations 1/2")
    p.say("  link x")
    p.end()
    assert out == [("iterations 1/2", True), ("  link x", True)]
