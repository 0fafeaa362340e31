"""mnist-scale-lab's helper package: the single source every notebook imports and every DDP worker runs.

Modules (each names the notebook that introduces it):
    paths        where data and results live (00)
    data         offline MNIST provisioning with checksums, in-memory and DataLoader routes (00)
    models       Net (the article's), NetBN, FastNet (00)
    train        TrainConfig, train_one_epoch, evaluate, fit (00, 02)
    distributed  rank/world size, backend choice, sharding, exact distributed evaluation (00, 06)
    launch       torchrun from a notebook cell: live output, root causes, no orphans (00)
    workers/     DDP worker scripts, run with torchrun or plain Python (00, 06)
"""

__version__ = "0.1.0"
