"""One worker of tests/test_torch_hook.py: the same batches through a DDP model with
``qaina_bench.torch``'s hook and through plain DDP (gloo all-reduce).

Run: ``python ddp_check.py OUT.npz STEPS`` with the process group's environment and
``$QAINA_AGENT_CONFIG``; OUT.npz gets, per step, the hooked bucket's averaged result
(``hooked_{i}``) and both models' flattened gradients (``hook_grad_{i}``, ``plain_grad_{i}``).
"""

import copy
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from qaina_bench.torch import TestbedState, testbed_hook


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state = TestbedState.from_env()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    hooked, plain = DistributedDataParallel(copy.deepcopy(net)), DistributedDataParallel(net)
    results = []

    def hook(state, bucket):
        future = testbed_hook(state, bucket)
        results.append(future.value().clone())
        return future

    hooked.register_comm_hook(state, hook)
    g = torch.Generator().manual_seed(rank + 1)
    saved = {}
    for i in range(steps):
        x, y = torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
        for name, model in (("hook", hooked), ("plain", plain)):
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            saved[f"{name}_grad_{i}"] = torch.cat([p.grad.ravel() for p in model.parameters()]
                                                  ).numpy().copy()
        saved[f"hooked_{i}"] = torch.cat([r.ravel() for r in results]).numpy()
        results.clear()
    state.close()
    np.savez(out, **saved)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
