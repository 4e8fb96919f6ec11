"""A small PyTorch DDP training script whose gradients go through the testbed.

An MLP learns scikit-learn's bundled digits (no downloads), each worker on its own
share of the training set, with DistributedDataParallel; ``--comm testbed`` (the
default) sends every gradient bucket through ``qaina_bench.torch``'s hook (the run's
bits, quantizer, packing, error feedback and ``--mode``), ``--comm allreduce`` uses
DDP's plain all-reduce (gloo) over the same network: the baseline. Steps, learning
rate, batch size, hidden layers and seed default to the run's settings (``--iterations``,
``--lr``, ``--batch-size``, ``--hidden``, ``--seed``). Start it with ``up``:

    qaina-bench up --topo star --jobs 1 --workers 2 --iterations 100 \\
        --train-script examples/ddp_digits.py
    qaina-bench up --topo star --jobs 1 --workers 2 --iterations 100 \\
        --train-script examples/ddp_digits.py --train-args "--comm allreduce"

Each worker prints its time per step, the bytes it sent and the final test accuracy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from qaina_bench.torch import TestbedState, allreduce_hook, testbed_hook


def digits(seed: int):
    """Train and test tensors: the 1797 digits, 80/20 in a fixed order, pixels in 0..1."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[order], dtype=torch.int64)
    cut = int(0.8 * len(y))
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def mlp(hidden: list[int]) -> nn.Module:
    sizes = [64, *hidden]
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], 10))


@torch.no_grad()
def accuracy(model: nn.Module, x, y) -> float:
    return float((model(x).argmax(1) == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comm", choices=("testbed", "allreduce"), default="testbed")
    parser.add_argument("--steps", type=int, help="default: the run's --iterations")
    parser.add_argument("--lr", type=float, help="default: the run's --lr")
    parser.add_argument("--batch-size", type=int, help="default: the run's --batch-size")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the hosts share the machine's cores with the switches
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from `up`
    rank, world = dist.get_rank(), dist.get_world_size()
    run = TestbedState.settings()  # the run's configuration tree
    steps = args.steps or run.workload.iterations
    batch = args.batch_size or run.training.batch_size
    (x, y), (x_test, y_test) = digits(run.workload.seed)
    x, y = x[rank::world], y[rank::world]  # this worker's share
    torch.manual_seed(run.workload.seed)  # the same initial model everywhere
    model = DistributedDataParallel(mlp(run.training.hidden))
    # The state last: its start record tells the harness this worker is ready to go
    # (DDP's construction takes seconds of imports the first time).
    state = TestbedState.from_env(through_testbed=args.comm == "testbed")
    model.register_comm_hook(state, testbed_hook if args.comm == "testbed" else allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr or run.training.lr)
    rng = np.random.default_rng([run.workload.seed, rank])
    t0 = time.perf_counter()
    for step in range(steps):
        if rank == 0 and step % run.training.eval_every == 0:
            state.note(test_accuracy=accuracy(model.module, x_test, y_test))
        pick = torch.from_numpy(rng.choice(len(y), batch, replace=False))
        loss = F.cross_entropy(model(x[pick]), y[pick])
        state.note(train_loss=loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    elapsed = time.perf_counter() - t0
    final = accuracy(model.module, x_test, y_test)
    t = state.totals
    print(f"rank {rank} ({args.comm}): {steps} steps, {1e3 * elapsed / steps:.1f} ms per step "
          f"({1e3 * t['comm_s'] / max(t['steps'], 1):.1f} ms aggregating), "
          f"{t['bytes_sent'] / 1e6:.3f} MB sent, test accuracy {final:.3f}")
    state.close(test_accuracy=final, ms_per_step=1e3 * elapsed / steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
