"""What a run's numbers are and where they go: ``metrics.py`` declares every metric
once, ``summary.py`` computes summary.json, ``fidelity.py`` the verdict and the CPU
cost, ``resultset.py`` the result set's files, ``tables.py`` and ``plots.py`` what the
CLI prints and draws, ``report.py`` and ``doctables.py`` the docs' tables from data."""
