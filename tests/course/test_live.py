"""The live training-curve figure (notebook 02) outside a notebook: callbacks, figure, bad input."""
import pytest

from mnist_helpers.course.live import LiveCurves


def row(epoch, acc):
    return {"epoch": epoch, "train_loss": 1 / epoch, "test_loss": 1.2 / epoch, "test_acc": acc, "images_per_s": 900.0}


def test_callbacks_track_steps_across_epochs_and_draw():
    live = LiveCurves(num_epochs=2, title="t", redraw_every_s=0, display=False)
    for epoch in (1, 2):
        for step in (1, 2, 3, 4):
            live.on_step(step, 1.0 / (epoch * step))
        live.on_epoch(row(epoch, 0.9 + epoch / 100))
    xs = [x for x, _ in live.steps]
    assert xs == sorted(xs) and xs[3] == pytest.approx(1.0) and xs[-1] == pytest.approx(2.0)
    fig = live.close()
    assert "epoch 2/2" in fig._suptitle.get_text() and "900 img/s" in fig._suptitle.get_text()
    assert live.redraws >= 3


def test_works_with_fit(small_mnist, mnist_root):
    from mnist_helpers.train import TrainConfig, fit
    live = LiveCurves(num_epochs=1, display=False)
    out = fit(TrainConfig(model="fastnet", subset=512, data_root=str(mnist_root), max_steps=3),
              on_epoch=live.on_epoch, on_step=live.on_step, verbose=False)
    assert len(live.steps) == 3 and live.epochs[0]["test_acc"] == out["final_test_acc"]


def test_bad_input():
    with pytest.raises(ValueError, match="num_epochs must be a positive integer"):
        LiveCurves(num_epochs=0)
    with pytest.raises(ValueError, match=r"on_epoch needs a history row with \['test_acc'\]"):
        LiveCurves(display=False).on_epoch({"epoch": 1, "train_loss": 1, "test_loss": 1})
