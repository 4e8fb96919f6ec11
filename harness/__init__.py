"""The harness: the ``qaina-bench`` CLI, switch targets, P4Runtime control plane,
network bring-up and measurement."""
