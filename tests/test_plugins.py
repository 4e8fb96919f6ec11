"""The plugin registries (plugins.py) without any plugin package installed."""

import pytest

from qaina_bench.plugins import PluginError, Registry


def test_registry_names_get_and_refusals():
    reg = Registry("widget", "qaina_bench.test-no-such-group")
    reg.add("a", 1)

    @reg.register("b")
    def b():
        return 2

    assert reg.names() == ("a", "b")
    assert reg.get("b") is b and "a" in reg and "c" not in reg and len(reg) == 2
    assert reg.origin("a") == "built in"
    reg.add("a", 1)  # the same object again is not a clash
    with pytest.raises(PluginError, match="unknown widget 'c': use one of a, b"):
        reg.get("c")
    with pytest.raises(PluginError, match="registered twice"):
        reg.add("a", 3)
    for bad in ("", "x,y", " x", None):
        with pytest.raises(PluginError, match="non-empty word"):
            reg.add(bad, 4)
