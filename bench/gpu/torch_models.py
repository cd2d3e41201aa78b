"""PyTorch counterparts of the bench models (the GPU measurement helpers the table scripts
share are in bench/gpu/runs.py).

Only ``torch`` is assumed (the GPU machine has no torchvision), so every network is written out
here with the same architecture as ``neuron.models`` (same layers, shapes and parameter counts;
``python -m bench.gpu.torch_models`` checks the counts against neuron's on the CPU):

* ``resnet --depth D`` (SuperNeurons Table 4: bottleneck (6, 32, n3, 6)), ``resnet50/101/152``:
  torchvision's Bottleneck v1.5 (stride on the 3x3), no torchvision needed;
* ``resnet_cifar --depth 6n+2``: He et al.'s CIFAR ResNet with option-B (1x1 conv + BN)
  projection shortcuts, as neuron's;
* ``alexnet``: the SuperNeurons paper's single-tower AlexNet with LRN (227x227; LRN n=5,
  alpha=5e-4 in torch's convention = the paper's 1e-4, beta 0.75, k 2);
* ``vgg16``: configuration D without BN;
* ``densenet121``: DenseNet-BC (6, 12, 24, 16), growth 32. Each dense layer returns
  ``cat([x, new_features])``: the "naive" concatenating DenseNet, the same memory behaviour as
  torchvision's default (``memory_efficient=False``) and as neuron's full join;
* ``inception_v4``: timm's layout, 299x299, BN eps 1e-3, dropout 0.2 before the classifier, 3x3
  average pools counting the padding (as neuron's AvgPool2d).

Every builder returns an ``nn.Sequential`` whose children are the natural units (stem layers,
residual/dense/inception blocks, head), which is what ``checkpoint_sequential`` splits into
sqrt(n) segments for the "PyTorch + checkpointing" columns.
"""
from __future__ import annotations

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (v1.5): 1x1 -> 3x3 (stride) -> 1x1 (4x), projection if needed."""

    def __init__(self, cin, planes, stride=1):
        super().__init__()
        cout = planes * 4
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock with an option-B projection when the shape changes."""

    def __init__(self, cin, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


def bottleneck_resnet(blocks, num_classes=1000) -> nn.Sequential:
    """ImageNet bottleneck ResNet with any block counts [n1, n2, n3, n4]."""
    mods = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, (n, planes) in enumerate(zip(blocks, (64, 128, 256, 512))):
        for j in range(n):
            mods.append(Bottleneck(cin, planes, 2 if (j == 0 and i > 0) else 1))
            cin = planes * 4
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*mods)


def table4_blocks(depth: int) -> list[int]:
    """SuperNeurons Table 4: depth = 3*(6 + 32 + n3 + 6) + 2, n3 >= 1."""
    n3, rem = divmod(depth - 2 - 3 * 44, 3)
    if rem or n3 < 1:
        raise ValueError(f"depth {depth} is not in the Table-4 family 3*(44+n3)+2, n3 >= 1")
    return [6, 32, n3, 6]


def cifar_resnet(depth: int, num_classes=10, in_channels=3) -> nn.Sequential:
    n, rem = divmod(depth - 2, 6)
    if rem or n < 1:
        raise ValueError(f"resnet_cifar: depth must be 6n+2, got {depth}")
    mods = [nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
            nn.ReLU(inplace=True)]
    cin = 16
    for i, planes in enumerate((16, 32, 64)):
        for j in range(n):
            mods.append(BasicBlock(cin, planes, 2 if (j == 0 and i > 0) else 1))
            cin = planes
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)]
    return nn.Sequential(*mods)


def alexnet(num_classes=1000) -> nn.Sequential:
    """The SuperNeurons AlexNet (Fig. 1): conv-relu-lrn-pool x2, conv x3, pool, fc x3."""
    lrn = lambda: nn.LocalResponseNorm(5, alpha=5e-4, beta=0.75, k=2.0)  # noqa: E731
    return nn.Sequential(
        nn.Conv2d(3, 96, 11, 4), nn.ReLU(inplace=True), lrn(), nn.MaxPool2d(3, 2),
        nn.Conv2d(96, 256, 5, padding=2), nn.ReLU(inplace=True), lrn(), nn.MaxPool2d(3, 2),
        nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 384, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Flatten(), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
        nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
        nn.Linear(4096, num_classes))


def vgg16(num_classes=1000) -> nn.Sequential:
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
           512, 512, 512, "M"]
    mods, cin = [], 3
    for v in cfg:
        if v == "M":
            mods.append(nn.MaxPool2d(2, 2))
        else:
            mods += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
            cin = v
    mods += [nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
             nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
             nn.Linear(4096, num_classes)]
    return nn.Sequential(*mods)


class DenseLayer(nn.Module):
    """BN-ReLU-Conv1x1(4k)-BN-ReLU-Conv3x3(k); returns the input with the k new channels
    appended (so a dense block is a plain sequence of these)."""

    def __init__(self, cin, growth=32, bn_size=4):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

    def forward(self, x):
        h = self.conv1(F.relu(self.norm1(x)))
        h = self.conv2(F.relu(self.norm2(h)))
        return torch.cat([x, h], 1)


def densenet121(num_classes=1000, growth=32, blocks=(6, 12, 24, 16)) -> nn.Sequential:
    mods = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1)]
    c = 64
    for i, n in enumerate(blocks):
        for _ in range(n):
            mods.append(DenseLayer(c, growth))
            c += growth
        if i != len(blocks) - 1:
            mods.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                                      nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)))
            c //= 2
    mods += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
             nn.Linear(c, num_classes)]
    return nn.Sequential(*mods)


# ---- Inception-v4 (timm's structure) ---------------------------------------------------------
class ConvBN(nn.Module):
    def __init__(self, cin, cout, k, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class _Branches(nn.Module):
    """Runs each branch on the input and concatenates the results along channels."""

    def __init__(self, *branches):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], 1)


class _Split(nn.Module):
    """stem -> two heads, concatenated (Inception-C's 1x3 / 3x1 pairs)."""

    def __init__(self, stem, a, b):
        super().__init__()
        self.stem, self.a, self.b = stem, a, b

    def forward(self, x):
        h = self.stem(x)
        return torch.cat([self.a(h), self.b(h)], 1)


def _avg():
    return nn.AvgPool2d(3, 1, 1, count_include_pad=True)


def _seq(*m):
    return nn.Sequential(*m)


def inception_a():
    return _Branches(ConvBN(384, 96, 1),
                     _seq(ConvBN(384, 64, 1), ConvBN(64, 96, 3, padding=1)),
                     _seq(ConvBN(384, 64, 1), ConvBN(64, 96, 3, padding=1),
                          ConvBN(96, 96, 3, padding=1)),
                     _seq(_avg(), ConvBN(384, 96, 1)))


def reduction_a():
    return _Branches(ConvBN(384, 384, 3, 2),
                     _seq(ConvBN(384, 192, 1), ConvBN(192, 224, 3, padding=1),
                          ConvBN(224, 256, 3, 2)),
                     nn.MaxPool2d(3, 2))


def inception_b():
    return _Branches(ConvBN(1024, 384, 1),
                     _seq(ConvBN(1024, 192, 1), ConvBN(192, 224, (1, 7), padding=(0, 3)),
                          ConvBN(224, 256, (7, 1), padding=(3, 0))),
                     _seq(ConvBN(1024, 192, 1), ConvBN(192, 192, (7, 1), padding=(3, 0)),
                          ConvBN(192, 224, (1, 7), padding=(0, 3)),
                          ConvBN(224, 224, (7, 1), padding=(3, 0)),
                          ConvBN(224, 256, (1, 7), padding=(0, 3))),
                     _seq(_avg(), ConvBN(1024, 128, 1)))


def reduction_b():
    return _Branches(_seq(ConvBN(1024, 192, 1), ConvBN(192, 192, 3, 2)),
                     _seq(ConvBN(1024, 256, 1), ConvBN(256, 256, (1, 7), padding=(0, 3)),
                          ConvBN(256, 320, (7, 1), padding=(3, 0)), ConvBN(320, 320, 3, 2)),
                     nn.MaxPool2d(3, 2))


def inception_c():
    return _Branches(ConvBN(1536, 256, 1),
                     _Split(ConvBN(1536, 384, 1), ConvBN(384, 256, (1, 3), padding=(0, 1)),
                            ConvBN(384, 256, (3, 1), padding=(1, 0))),
                     _Split(_seq(ConvBN(1536, 384, 1), ConvBN(384, 448, (3, 1), padding=(1, 0)),
                                 ConvBN(448, 512, (1, 3), padding=(0, 1))),
                            ConvBN(512, 256, (1, 3), padding=(0, 1)),
                            ConvBN(512, 256, (3, 1), padding=(1, 0))),
                     _seq(_avg(), ConvBN(1536, 256, 1)))


def inception_v4(num_classes=1000) -> nn.Sequential:
    mods = [ConvBN(3, 32, 3, 2), ConvBN(32, 32, 3), ConvBN(32, 64, 3, padding=1),
            _Branches(nn.MaxPool2d(3, 2), ConvBN(64, 96, 3, 2)),                     # Mixed3a
            _Branches(_seq(ConvBN(160, 64, 1), ConvBN(64, 96, 3)),                    # Mixed4a
                      _seq(ConvBN(160, 64, 1), ConvBN(64, 64, (1, 7), padding=(0, 3)),
                           ConvBN(64, 64, (7, 1), padding=(3, 0)), ConvBN(64, 96, 3))),
            _Branches(ConvBN(192, 192, 3, 2), nn.MaxPool2d(3, 2))]                    # Mixed5a
    mods += [inception_a() for _ in range(4)] + [reduction_a()]
    mods += [inception_b() for _ in range(7)] + [reduction_b()]
    mods += [inception_c() for _ in range(3)]
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(1536, num_classes)]
    return nn.Sequential(*mods)


#: name -> (builder(depth) -> nn.Sequential, per-sample input shape, classes)
MODELS = {
    "resnet": (lambda d: bottleneck_resnet(table4_blocks(d)), (3, 224, 224), 1000),
    "resnet50": (lambda d: bottleneck_resnet([3, 4, 6, 3]), (3, 224, 224), 1000),
    "resnet101": (lambda d: bottleneck_resnet([3, 4, 23, 3]), (3, 224, 224), 1000),
    "resnet152": (lambda d: bottleneck_resnet([3, 8, 36, 3]), (3, 224, 224), 1000),
    "resnet_cifar": (lambda d: cifar_resnet(d), (3, 32, 32), 10),
    "alexnet": (lambda d: alexnet(), (3, 227, 227), 1000),
    "vgg16": (lambda d: vgg16(), (3, 224, 224), 1000),
    "densenet121": (lambda d: densenet121(), (3, 224, 224), 1000),
    "inception_v4": (lambda d: inception_v4(), (3, 299, 299), 1000),
}


def build(name: str, depth: int | None = None) -> tuple[nn.Sequential, tuple, int]:
    """(model, per-sample input shape, number of classes) for a neuron model name."""
    if name not in MODELS:
        raise KeyError(f"no PyTorch counterpart for {name!r}; have {', '.join(MODELS)}")
    fn, shape, classes = MODELS[name]
    return fn(depth), shape, classes


def segments_for(model: nn.Sequential) -> int:
    """checkpoint_sequential's segment count: sqrt(n) of the Sequential's children."""
    return max(1, round(math.sqrt(len(model))))
# ---------------------------------------------------------------------------------------------
# self-check (CPU): parameter counts against neuron's models, and one forward per model
# ---------------------------------------------------------------------------------------------
def _check():
    from neuron.models import build_model
    cases = [("alexnet", None), ("vgg16", None), ("resnet50", None), ("resnet101", None),
             ("resnet152", None), ("resnet", 137), ("resnet_cifar", 56), ("densenet121", None),
             ("inception_v4", None)]
    bad = 0
    for name, depth in cases:
        m, shape, classes = build(name, depth)
        tp = sum(p.numel() for p in m.parameters())
        npar = build_model(name, depth=depth).num_params()
        with torch.no_grad():
            y = m.eval()(torch.zeros(1, *shape))
        ok = tp == npar and tuple(y.shape) == (1, classes)
        bad += not ok
        print(f"{name:14} depth {depth}: torch {tp:,} params, neuron {npar:,}, "
              f"{len(m)} units -> {segments_for(m)} segments, out {tuple(y.shape)} "
              f"{'OK' if ok else 'MISMATCH'}", flush=True)
    # one training step with checkpoint_sequential on the CPU: same loss and gradients as eager
    from torch.utils.checkpoint import checkpoint_sequential
    m, shape, classes = build("resnet_cifar", 20)
    m = m.double().train()
    x, y = torch.randn(4, *shape, dtype=torch.float64), torch.randint(0, classes, (4,))
    state = {k: v.clone() for k, v in m.state_dict().items()}
    F.cross_entropy(m(x), y).backward()
    g_eager = [p.grad.clone() for p in m.parameters()]
    m.load_state_dict(state)
    m.zero_grad()
    F.cross_entropy(checkpoint_sequential(m, segments_for(m), x, use_reentrant=False),
                    y).backward()
    same = all(torch.allclose(a, p.grad) for a, p in zip(g_eager, m.parameters()))
    print(f"checkpoint_sequential gradients equal eager's (resnet_cifar 20, float64): {same}")
    return bad + (not same)


if __name__ == "__main__":
    sys.exit(1 if _check() else 0)
