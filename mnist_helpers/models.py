"""The series' three models (introduced in 00_setup_and_data).

- ``Net``: exactly the source article's network (section 5.1), 1,199,882 parameters.
- ``NetBN``: the same with BatchNorm after each convolution, for the SyncBatchNorm lesson (06),
  1,200,074 parameters.
- ``FastNet``: a small, fast CNN for the speed lessons (10), 35,890 parameters at the default width.
- ``MLP``: a one-hidden-layer perceptron for 04's long batch-size sweep, 203,530 parameters at the default width.

``build_model(name)`` makes one by its name in ``TrainConfig.model``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """The article's Net: conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, flatten (9216),
    fc 128, ReLU, fc 10, log_softmax. 1,199,882 parameters, 98% of them in fc1 (9216 x 128)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


class NetBN(Net):
    """Net with BatchNorm2d after each convolution (per-process statistics under DDP unless converted
    with ``nn.SyncBatchNorm.convert_sync_batchnorm``). 1,200,074 parameters."""

    def __init__(self):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(32)
        self.bn2 = nn.BatchNorm2d(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def _block(c_in: int, c_out: int) -> nn.Sequential:
    # conv -> BN -> ReLU -> pool: BatchNorm lets a small net train fast at high learning rates.
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(inplace=True), nn.MaxPool2d(2))


class FastNet(nn.Module):
    """A small CNN for the speed lessons: three conv-BN-ReLU-pool blocks (28 -> 14 -> 7 -> 3) and one
    linear layer. ``width`` sets the first block's channels (then 2x, 2x). 35,890 parameters at
    width 24: 33x fewer than Net; 6.4 MFLOP per forward image against Net's 24.0 (``flops_per_image``)."""

    def __init__(self, width: int = 24):
        super().__init__()
        w1, w2, w3 = width, 2 * width, 2 * width
        self.features = nn.Sequential(_block(1, w1), _block(w1, w2), _block(w2, w3))
        self.head = nn.Linear(w3 * 3 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.features(x), 1)
        return F.log_softmax(self.head(x), dim=1)


class SpeedNet(nn.Module):
    """FastNet tuned for a CPU speedrun: three blocks, narrower (``width`` -> 2x -> 4x channels), with a 5x5 first
    block so one layer sees a stroke, and each block pooling *before* its BatchNorm and ReLU (conv-pool-BN-ReLU, the
    order of KellerJordan/cifar10-airbench): BatchNorm, ReLU and their backward passes then touch a quarter of the
    activations, which on a CPU is where a small net's step spends its time (notebook 10's ladder measures what it
    buys: its ``poolfirst`` step against ``smallnet``, SpeedNetV1). At width 12: 17,758 parameters and 2.5 MFLOP per
    forward image (``flops_per_image``), against Net's 24.0 and FastNet's 6.4. Introduced in 10_speedrun."""

    pool_first = True
    strided_stem = False

    def __init__(self, width: int = 12):
        super().__init__()
        w1, w2, w3 = width, 2 * width, 4 * width

        def block(c_in, c_out, k, stride=1):
            conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, bias=False)
            pool = [nn.MaxPool2d(2)] if stride == 1 else []  # a strided conv has already halved the resolution
            bn_relu = [nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
            return nn.Sequential(conv, *(pool + bn_relu if self.pool_first else bn_relu + pool))

        stem = block(1, w1, 5, stride=2) if self.strided_stem else block(1, w1, 5)
        self.features = nn.Sequential(stem, block(w1, w2, 3), block(w2, w3, 3))
        self.head = nn.Linear(w3 * 3 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.head(torch.flatten(self.features(x), 1)), dim=1)


class SpeedNetV1(SpeedNet):
    """SpeedNet as first built, in FastNet's block order (conv-BN-ReLU-pool): the same parameters and FLOPs, but
    BatchNorm and ReLU run on the full-resolution activations. Notebook 10's ladder measures what pooling first buys."""

    pool_first = False


class SpeedNetS2(SpeedNet):
    """SpeedNet with a strided first layer: its 5x5 convolution steps by 2 (28x28 -> 14x14 directly) instead of
    convolving all 784 positions and max-pooling them, as ResNet's stem does. Same parameters; the first layer costs a
    quarter of its FLOPs and the full-resolution pooling (and its backward) is gone, which on a 2-core CPU was the most
    expensive part of SpeedNet's step (notebook 10's ladder measures it: its ``stride2`` step). At width 12: 17,758
    parameters and 2.2 MFLOP per forward image."""

    strided_stem = True


class MLP(nn.Module):
    """A one-hidden-layer perceptron (784 -> ``width`` ReLU -> 10, log_softmax), no BatchNorm: the plain SGD setting of
    the linear scaling rule, fast enough on a CPU for many long runs (04's batch-size sweep). 203,530 parameters at
    width 256. Introduced in 04_batch_size_and_lr."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, width)
        self.fc2 = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


MODELS = {"net": Net, "netbn": NetBN, "fastnet": FastNet, "speednet": SpeedNet, "speednet_v1": SpeedNetV1,
          "speednet_s2": SpeedNetS2, "mlp": MLP}


def build_model(name: str, width: int | None = None) -> nn.Module:
    """A fresh model by name (a key of ``MODELS``); ``width`` for fastnet, speednet(_v1, _s2) and mlp (None: the class
    default)."""
    try:
        cls = MODELS[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None
    if width is None:
        return cls()
    if not issubclass(cls, (FastNet, SpeedNet, MLP)):
        raise ValueError(f"width only applies to fastnet, speednet(_v1, _s2) and mlp, not {name!r}; leave width=None")
    return cls(width)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_image(model: nn.Module) -> int:
    """Forward multiply-adds x 2 per 28x28 image, counted from conv and linear layers via hooks."""
    total = 0

    def hook(mod, inp, out):
        nonlocal total
        if isinstance(mod, nn.Conv2d):
            k = mod.kernel_size[0] * mod.kernel_size[1] * (mod.in_channels // mod.groups)
            total += 2 * k * out.numel()
        elif isinstance(mod, nn.Linear):
            total += 2 * mod.in_features * mod.out_features * (out.numel() // mod.out_features)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, 1, 28, 28, device=next(model.parameters()).device))
        model.train(was_training)
    finally:
        for h in handles:
            h.remove()
    return total
