"""Test worker: exact distributed evaluation vs DistributedSampler padding vs one process.

Every rank builds the same seeded model, so the only thing that differs between world sizes is how
the 10,000 test images are split. Rank 0 writes --out JSON.
"""
import argparse
import json

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DistributedSampler

from mnist_helpers.data import load_mnist
from mnist_helpers.distributed import all_reduce_sum, cleanup, evaluate_exact, init_distributed
from mnist_helpers.models import build_model
from mnist_helpers.train import evaluate, seed_everything


@record
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ctx = init_distributed("gloo")
    try:
        seed_everything(0)
        model = build_model("fastnet")
        # A few seeded SGD steps so accuracy is far from chance and ties are rare.
        X, y, Xt, yt = load_mnist(subset=(512, 10000))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(0, 512, 64):
            opt.zero_grad()
            torch.nn.functional.nll_loss(model(X[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
        exact = evaluate_exact(model, Xt, yt, ctx, batch_size=500)
        sampler = DistributedSampler(range(len(Xt)), num_replicas=ctx.world_size, rank=ctx.rank, shuffle=False)
        idx = torch.tensor(list(sampler))
        padded = evaluate(model, Xt[idx], yt[idx], 500)
        pad_correct, pad_count = all_reduce_sum([padded["correct"], padded["count"]], ctx.device)
        single = evaluate(model, Xt, yt, 500)  # every rank can score the whole set alone
        if ctx.is_main:
            json.dump({"world_size": ctx.world_size, "exact": exact, "padded_count": pad_count,
                       "padded_correct": pad_correct, "single": single}, open(args.out, "w"))
    finally:
        cleanup()


if __name__ == "__main__":
    main()
