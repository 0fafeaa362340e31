"""A run that stops at its target leaves its DataLoader mid-epoch; its worker processes must stop when the run ends,
not whenever the garbage collector next runs (data.release_workers: in notebook 09 that collection landed in a
plotting cell and cost 20-80 s, on torch 2.14.1)."""
import gc
import multiprocessing
import weakref

import pytest
import torch

from mnist_helpers.data import release_workers
from mnist_helpers.lessons.n09.profiling import time_to_accuracy
from mnist_helpers.train import TrainConfig, make_train_batches


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_training_loader_is_freed_by_its_last_reference(mnist_root, world_size):
    """No reference cycle (set_epoch once referred to the loader itself): without workers, no process starts."""
    import torchvision  # noqa: F401 - imported first: an exception kept at its import holds the importer's frames
    cfg = TrainConfig(loader="dataloader", num_workers=0, subset=256, batch_size=64)
    loader = make_train_batches(cfg, torch.device("cpu"), rank=0, world_size=world_size)
    loader.set_epoch(1)
    gone = weakref.ref(loader)
    gc.disable()  # only reference counting may free it
    try:
        del loader
        assert gone() is None
    finally:
        gc.enable()


def test_release_workers_leaves_other_batches_alone():
    release_workers([(torch.zeros(1), torch.zeros(1))])  # a list: nothing to stop, no error
    release_workers(object())


@pytest.mark.process  # DataLoader workers
def test_a_run_that_reaches_its_target_stops_its_loader_workers(mnist_root):
    cfg = TrainConfig(model="fastnet", loader="dataloader", num_workers=2, subset=4096, batch_size=64)
    from mnist_helpers.data import load_mnist

    _, _, X_test, y_test = load_mnist(subset=(1, 200))
    gc.disable()  # the collector must not do the run's cleanup for it
    try:
        res = time_to_accuracy(cfg, X_test, y_test, 0.30, eval_every_images=640, max_images=4096)
        assert res["reached"] and res["images"] < 4096  # it stopped mid-epoch, with its loader's workers running
        assert [p for p in multiprocessing.active_children() if p.is_alive()] == []
    finally:
        gc.enable()
