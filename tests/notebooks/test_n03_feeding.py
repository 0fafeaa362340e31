"""DataLoader sweeps and alternatives (notebook 03) on tiny data: tables, memory readings, verdicts, widget."""
import math
import multiprocessing

import pytest
import torch

from mnist_helpers.data import make_loader
from mnist_helpers.lessons.n03 import feeding
from mnist_helpers.lessons.n03 import lesson as lb


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # steadier timings (tests/conftest.py)


@pytest.fixture(scope="module")
def tv(mnist_root):
    return lb.make_dataset("torchvision", mnist_root, subset=512)


def test_default_worker_counts_reach_twice_the_cores():
    assert lb.default_worker_counts(2) == [0, 1, 2, 4]
    assert lb.default_worker_counts(8) == [0, 1, 2, 4, 8, 16]
    assert lb.default_worker_counts(3) == [0, 1, 2, 4, 6]


def test_datasets_agree(mnist_root):
    a, b, c = (lb.make_dataset(k, mnist_root, subset=64) for k in lb.DATASET_KINDS)
    for ds in (b, c):
        assert len(ds) == 64
        assert torch.allclose(ds[5][0], a[5][0], atol=1e-5) and int(ds[5][1]) == a[5][1]
    assert lb.dataset_nbytes(b) == 64 * 784 * 4 + 64 * 8
    with pytest.raises(ValueError, match="kind must be one of"):
        lb.make_dataset("parquet")


@pytest.mark.process
def test_loader_sweep_collapses_worker_knobs_at_zero(tv):
    rows = lb.loader_sweep(tv, num_workers=(0, 1), prefetch_factor=(2, 4), persistent_workers=(False, True),
                           epochs=2, max_batches=2, repeats=2)
    assert all(len(r["repeats"]) == 2 for r in rows)
    assert [r["num_workers"] for r in rows].count(0) == 1 and len(rows) == 1 + 4
    zero = rows[0]
    assert zero["prefetch_factor"] is None and zero["persistent_workers"] is False
    assert all(r["images_per_s"] > 0 and r["first_batch_s"] >= 0 for r in rows)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_workers": ()}, "at least one value"),
    ({"num_workers": (-1,)}, "integers >= 0"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
])
def test_bad_sweep_arguments(tv, kwargs, match):
    with pytest.raises(ValueError, match=match):
        lb.loader_sweep(tv, **kwargs)


@pytest.mark.process
def test_training_sweep_splits_wait_and_compute(tv):
    made = []

    def make(dataset, batch_size, **kw):  # the notebook passes its own DataLoader construction
        made.append(kw["num_workers"])
        return make_loader(dataset, batch_size, **kw)
    rows = lb.training_sweep(tv, num_workers=(0, 1), batch_size=64, model="fastnet", steps=2, warmup_steps=1,
                             repeats=2, make=make)
    assert made == [0, 1, 0, 1], "interleaved rounds, through the given construction"
    assert [r["loader"] for r in rows] == ["DataLoader, 0 workers", "DataLoader, 1 workers",
                                           "in-memory batches on cpu"]
    for r in rows:
        assert 0 < r["wait_fraction"] < 1 and r["images"] == 2 * 64 and len(r["repeats"]) == 2
        assert min(r["repeats"]) <= r["images_per_s"] <= max(r["repeats"])


@pytest.mark.process
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_worker_memory_reads_each_worker(mnist_root):
    ds = {"tensor": lb.make_dataset("tensor", mnist_root, subset=2000),
          "pylist": lb.make_dataset("pylist", mnist_root, subset=2000)}
    rows = lb.memory_sweep(ds, num_workers=1, batch_size=200, start_methods=("fork",))  # named: 3.14 defaults to forkserver
    assert [r["dataset"] for r in rows] == ["tensor", "pylist"]
    for r in rows:
        assert r["start_method"] == "fork" and r["worker_uss_mib"] > 0
        assert r["worker_uss_mib"] <= r["worker_pss_mib"] <= r["worker_rss_mib"]
        assert math.isfinite(r["copied_fraction"]) and r["added_uss_mib"] >= 0 and r["baseline_uss_mib"] > 0


def test_disk_read_rate(mnist_root):
    from mnist_helpers.data import raw_dir
    r = lb.disk_read_rate(raw_dir(mnist_root) / "t10k-labels-idx1-ubyte", repeats=1)
    assert r["cold_mib_per_s"] > 0 and r["warm_mib_per_s"] > 0 and r["mib"] < 1


def test_uint8_batches_match_normalised_tensors(mnist_root):
    from mnist_helpers.data import load_mnist
    X_u8, y = feeding.raw_uint8(mnist_root, subset=300)
    X, y2, _, _ = load_mnist(mnist_root, subset=(300, 1))
    batches = feeding.Uint8Batches(X_u8, y, 128, seed=1)
    got = list(batches)
    assert len(batches) == len(got) == 3 and sum(len(b[0]) for b in got) == 300
    Xb, yb = got[0]
    idx = torch.randperm(300, generator=torch.Generator().manual_seed(1))[:128]
    assert torch.allclose(Xb, X[idx], atol=1e-5) and torch.equal(yb, y2[idx])
    with pytest.raises(ValueError, match="uint8"):
        feeding.Uint8Batches(X, y, 8)


def test_feed_rates_table(mnist_root):
    rows = feeding.feed_rates(mnist_root, subset=512, num_workers=(0,), epochs=1, dataloader_max_batches=2)
    names = [r["feed"] for r in rows]
    assert any(n.startswith("TensorBatches") for n in names) and any(n.startswith("uint8") for n in names)
    assert all(len(r["repeats"]) == 1 for r in rows)
    assert max(r["ratio_vs_dataloader"] for r in rows if r["feed"].startswith("DataLoader")) == pytest.approx(1.0)


def test_drop_last_effect(small_mnist):
    X, y, _, _ = small_mnist
    r = lb.drop_last_effect(X[:300], y[:300], batch_size=128, model="fastnet", trials=2)
    assert r["last_batch"] == 44 and r["steps_keep"] == 3 and r["steps_drop"] == 2
    assert r["expected_ratio"] == pytest.approx(math.sqrt(128 / 44))
    assert r["grad_error_last_batch"] > 0 and r["batchnorm_with_one_image"] == "accepted"
    assert len(r["grad_errors_full_batch"]) == len(r["grad_errors_last_batch"]) == 2
    assert r["batchnorm1d_with_one_sample"].startswith("ValueError")
    with pytest.raises(ValueError, match="need more than batch_size"):
        lb.drop_last_effect(X[:10], y[:10], batch_size=128)


def _rows(table):
    return [{"num_workers": w, "images_per_s": sorted(reps)[len(reps) // 2], "repeats": reps} for w, reps in table]


def test_workers_verdict_compares_spreads():
    rule_wins = _rows([(0, [100, 104, 98]), (1, [180, 190, 185]), (2, [200, 170, 195]), (4, [150, 140, 160])])
    assert lb.workers_verdict(rule_wins, cores=2)["verdict"] == "holds"       # 1 worker overlaps the best
    zero_wins = _rows([(0, [300, 310, 305]), (1, [180, 190, 185]), (4, [150, 140, 160])])
    v = lb.workers_verdict(zero_wins, cores=2)
    assert v["verdict"] == "does not hold here" and v["best_workers"] == 0 and v["rule_workers"] == 1
    assert lb.workers_verdict(_rows([(0, [300]), (1, [180])]), cores=2)["verdict"] == "inconclusive"
    assert lb.workers_verdict(_rows([(0, [3, 3])]), cores=2)["verdict"] == "not testable here"
    with pytest.raises(ValueError, match="no rows with num_workers"):
        lb.workers_verdict([], cores=2)


def test_too_many_verdict_needs_a_gap_outside_the_spread():
    slow = _rows([(0, [300, 310, 305]), (1, [180, 190, 185]), (4, [150, 140, 160])])
    assert lb.too_many_verdict(slow, cores=2)["verdict"] == "holds"
    same = _rows([(0, [300, 310, 305]), (4, [298, 312, 300])])
    assert lb.too_many_verdict(same, cores=2)["verdict"] == "does not hold here"
    noisy = _rows([(0, [300, 400, 305]), (4, [200, 310, 220])])
    assert lb.too_many_verdict(noisy, cores=2)["verdict"] == "inconclusive"
    assert lb.too_many_verdict(slow[:2], cores=2)["verdict"] == "not testable here"


@pytest.mark.process
def test_widget_degrades_to_static_output(tv, capsys):
    from mnist_helpers.lessons.n03.lesson import loader_widget
    rows = loader_widget(tv, num_workers=1, batch_size=64, max_batches=2, interactive=False)
    out = capsys.readouterr().out
    assert len(rows) == 1 and "img/s" in out
