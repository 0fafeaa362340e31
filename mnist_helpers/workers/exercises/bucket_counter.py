"""The measurement behind exercise 06-2: DDP's all-reduce calls per training step of the article's ``Net``, counted
by a communication hook (DDP calls it once per bucket of gradients), at ``bucket_cap_mb`` 25 (DDP's default) and 1.
The check launches it after you have made your prediction (notebook 06, exercise 06-2).

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.exercises.bucket_counter --out work/buckets.json

Rank 0 writes ``{cap: [the numel of each bucket all-reduced in the last step]}`` to ``--out``.
"""
import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.models import Net

parser = argparse.ArgumentParser()
parser.add_argument("--out")
args = parser.parse_args()
dist.init_process_group("gloo")
calls = []


def counting_allreduce(state, bucket):  # DDP calls its hook once per bucket of gradients
    calls.append(bucket.buffer().numel())
    work = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


result = {}
for cap in (25, 1):  # bucket_cap_mb: 25 is DDP's default
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=cap)
    model.register_comm_hook(None, counting_allreduce)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):  # DDP settles its buckets after the first step: count the last one
        calls.clear()
        model(torch.randn(8, 1, 28, 28)).sum().backward()
        opt.step()
        opt.zero_grad()
    result[cap] = list(calls)
    del model  # release DDP's hold on the process group before leaving it
if dist.get_rank() == 0:
    json.dump(result, open(args.out, "w"))
dist.barrier()
dist.destroy_process_group()
