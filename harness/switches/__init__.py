"""The switches as the harness drives them: ``targets.py`` starts a switch of either
target (the embedded switch or BMv2), ``control.py`` is the P4Runtime control plane,
``jobs.py`` what it writes for a job (entries, multicast groups, source guards),
``firewall.py`` the loopback-only guard of BMv2's Thrift port."""
