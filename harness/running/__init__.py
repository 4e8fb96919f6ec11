"""A run of the testbed: ``run.py`` carries it out (network up, jobs programmed,
agents launched, everything torn down, results written), ``network.py`` brings the
Mininet network and its switches up, ``starter.py`` forks this machine's agents from
one process that has loaded them, ``processes.py`` and ``record.py`` keep what it
started, ``sampling.py`` and ``cpustat.py`` measure while it runs, ``arrivals.py``
admits jobs over time, ``linkloss.py`` and ``cpulimit.py`` shape links and hosts."""
