"""Exercise 12-1, a solution: the starter (local_rank_starter.py) reading torchrun's ``LOCAL_RANK`` from the
environment, which torchrun sets in every process (it passes no ``--local_rank`` argument).

    torchrun --standalone --nproc-per-node=2 work/local_rank_exercise.py --out work/devices.json

Rank 0 writes the device every process picked to ``--out``; the check launches your copy on 2 processes and reads it.
"""
import argparse
import json
import os

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--out")
args = parser.parse_args()
dist.init_process_group("gloo")
device = f"cuda:{int(os.environ['LOCAL_RANK'])}"  # the GPU this process would train on: torchrun's LOCAL_RANK
devices = [None] * dist.get_world_size()
dist.all_gather_object(devices, device)
if dist.get_rank() == 0:
    json.dump(devices, open(args.out, "w"))
dist.barrier()
dist.destroy_process_group()
