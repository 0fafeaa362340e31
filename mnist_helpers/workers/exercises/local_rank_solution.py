# exercise: begin
# | """Exercise 12-1, the starter: a short DDP worker that picks its GPU the article's way, from an argparse
# | ``--local_rank``. Copy it, then fix the copy so that under torchrun each process names its own GPU (notebook 12,
# | exercise 12-1; section 1 shows the bug). No GPU is needed: the script only names the device.
# |
# |     torchrun --standalone --nproc-per-node=2 work/local_rank_exercise.py --out work/devices.json
# |
# | Rank 0 writes the device every process picked to ``--out``; the check launches your copy on 2 processes and reads it.
# | """
"""Exercise 12-1, a solution: the starter reading torchrun's ``LOCAL_RANK`` from the environment, which torchrun
sets in every process (it passes no ``--local_rank`` argument). The starter the learner copies (LOCAL_RANK_STARTER)
is read out of this file: each `# exercise:` region holds its lines as `# |` comments.

    torchrun --standalone --nproc-per-node=2 work/local_rank_exercise.py --out work/devices.json

Rank 0 writes the device every process picked to ``--out``; the check launches your copy on 2 processes and reads it.
"""
# exercise: end
import argparse
import json
# exercise: begin
import os
# exercise: end

import torch.distributed as dist

parser = argparse.ArgumentParser()
# exercise: begin
# | parser.add_argument("--local_rank", type=int, default=0)  # the old torch.distributed.launch contract
# exercise: end
parser.add_argument("--out")
args = parser.parse_args()
dist.init_process_group("gloo")
# exercise: begin
# | device = f"cuda:{args.local_rank}"  # the GPU this process would train on
device = f"cuda:{int(os.environ['LOCAL_RANK'])}"  # the GPU this process would train on: torchrun's LOCAL_RANK
# exercise: end
devices = [None] * dist.get_world_size()
dist.all_gather_object(devices, device)
if dist.get_rank() == 0:
    json.dump(devices, open(args.out, "w"))
dist.barrier()
dist.destroy_process_group()
