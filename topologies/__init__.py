"""Mininet topologies of the testbed."""
