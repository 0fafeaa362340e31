"""Exercise 06-1, the starter: a single-device training script. Copy it, then turn the copy into a DDP script that
torchrun launches on several processes (notebook 06, exercise 06-1; section 2's list says what changes).

    python work/ddp_exercise.py --epochs 2 --subset 2000 --test-images 1001              # as it is: one process
    torchrun --standalone --nproc-per-node=2 work/ddp_exercise.py --epochs 2 --subset 2000 --test-images 1001 \
        --report work/ddp_report                                                         # once it is a DDP script

The REPORT block at the end writes, per process, the images it trained on, its final weights' digest and its test
result; the check launches your script on 2 processes and compares them. Leave that block as it is.
"""
import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from mnist_helpers.data import load_mnist               # MNIST as tensors (md5-checked files)
from mnist_helpers.distributed import params_digest     # sha256 of the weights: equal digests = equal bits
from mnist_helpers.models import Net                    # the article's Net

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--subset", type=int, default=60_000, help="training images")
parser.add_argument("--test-images", type=int, default=10_000)
parser.add_argument("--device", default="cpu", help="cpu or cuda")
parser.add_argument("--out", default=None, help="results JSON")
parser.add_argument("--report", default=None, help="folder: each process writes its facts there (the check)")
args = parser.parse_args()


def evaluate(model, X, y, device):
    """(correct, images scored) over the test set, 1,000 images at a time."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(X), 1000):
            correct += (model(X[i:i + 1000].to(device)).argmax(1) == y[i:i + 1000].to(device)).sum().item()
    return correct, len(X)


def main():
    device = torch.device(args.device)
    torch.manual_seed(0)
    X, y, X_test, y_test = load_mnist(subset=(args.subset, args.test_images))
    train_set = TensorDataset(X, y, torch.arange(len(X)))  # each image with its index: what the REPORT lists
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    model = Net().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = time.perf_counter()
    seen = []  # per epoch, the indices of the images this process trained on, in the order drawn
    for epoch in range(args.epochs):
        model.train()
        seen.append([])
        for X_b, y_b, index in loader:
            seen[-1] += index.tolist()
            X_b, y_b = X_b.to(device), y_b.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(X_b), y_b)
            loss.backward()
            optimizer.step()
        correct, count = evaluate(model, X_test, y_test, device)
        print(f"epoch {epoch}: {time.perf_counter() - start:.1f} s, test accuracy {correct / count:.2%} "
              f"({count:,} images)")

    if args.out:
        json.dump({"correct": correct, "count": count, "digest": params_digest(model),
                   "seconds": time.perf_counter() - start}, open(args.out, "w"))

    # REPORT: leave this block as it is. Every process writes its own facts, one file each (RANK: torchrun sets it;
    # 0 when the script runs alone); the check compares the files of the processes
    if args.report:
        rank = int(os.environ.get("RANK", 0))
        Path(args.report).mkdir(parents=True, exist_ok=True)
        facts = {"rank": rank, "seen": seen, "digest": params_digest(model), "correct": correct, "count": count}
        (Path(args.report) / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main()
