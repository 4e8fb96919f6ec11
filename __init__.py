"""qaina-bench: a testbed for quantization-aware in-network aggregation of gradients.

The package's parts are the repository's top-level folders:

* ``qaina_bench.p4``         the data plane: ``qaina.p4``, its P4Info, the QAINA header
                             and the embedded software switch;
* ``qaina_bench.hosts``      what runs on a worker: traces, quantizer, lane packing, agent;
* ``qaina_bench.topologies`` Mininet topologies;
* ``qaina_bench.harness``    the CLI, switch targets, P4Runtime control plane, measurement,
                             result sets (``results/`` holds only run outputs).
* ``qaina_bench.torch``      a PyTorch DDP communication hook through the testbed
                             (``torch.py``; ``up --train-script``).
"""

__version__ = "0.1.0"
