"""Benchmarks that print figures (never timed tests): ``bench.py`` the switch alone,
``testbedbench.py`` whole runs and the CPU cost table, ``controlbench.py`` P4Runtime
reads, ``benchcli.py`` their ``qaina-bench bench`` commands."""
