"""Hand-built torch references with torchvision's structure vs neuron.models' names/shapes."""
from __future__ import annotations

from collections import OrderedDict

import pytest

from models_reference import param_shapes
from neuron.models import build_model
from neuron.models.densenet import densenet
from neuron.models.resnet import resnet_bottleneck


# ---------------------------------------------------------------------------------------
# hand-built torch references with torchvision's module structure (names, shapes)
# ---------------------------------------------------------------------------------------
def _torch_state_shapes(module):
    return {k: tuple(v.shape) for k, v in module.state_dict().items()
            if not k.endswith("num_batches_tracked")}


def _torch_resnet(block_kind, blocks, num_classes, stem="imagenet", widths=(64, 128, 256, 512)):
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, planes, stride, down):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU()
            self.downsample = down

        def forward(self, x):
            o = self.relu(self.bn1(self.conv1(x)))
            o = self.relu(self.bn2(self.conv2(o)))
            o = self.bn3(self.conv3(o))
            return self.relu(o + (x if self.downsample is None else self.downsample(x)))

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin, planes, stride, down):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.downsample = down

        def forward(self, x):
            o = self.relu(self.bn1(self.conv1(x)))
            o = self.bn2(self.conv2(o))
            return self.relu(o + (x if self.downsample is None else self.downsample(x)))

    block = Bottleneck if block_kind == "bottleneck" else Basic

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            if stem == "imagenet":
                self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
                self.maxpool = nn.MaxPool2d(3, 2, 1)
            else:
                self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
                self.maxpool = nn.Identity()
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU()
            cin = widths[0]
            for i, (n, w) in enumerate(zip(blocks, widths)):
                layers = []
                for j in range(n):
                    stride = 2 if (i > 0 and j == 0) else 1
                    down = None
                    if stride != 1 or cin != w * block.expansion:
                        down = nn.Sequential(nn.Conv2d(cin, w * block.expansion, 1, stride,
                                                       bias=False),
                                             nn.BatchNorm2d(w * block.expansion))
                    layers.append(block(cin, w, stride, down))
                    cin = w * block.expansion
                setattr(self, f"layer{i + 1}", nn.Sequential(*layers))
            self.n_stages = len(blocks)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            for i in range(self.n_stages):
                x = getattr(self, f"layer{i + 1}")(x)
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return torch, Net()


def _compare_activation_shapes(torch, ref, g, in_shape, names):
    """Run the torch reference on a zero batch and compare the outputs of named modules."""
    seen = {}
    mods = dict(ref.named_modules())
    hooks = [mods[n].register_forward_hook(
        lambda m, i, o, n=n: seen.__setitem__(n, tuple(o.shape[1:]))) for n in names]
    with torch.no_grad():
        out = ref.eval()(torch.zeros(1, *in_shape))
    for h in hooks:
        h.remove()
    for n in names:
        assert g.layers[n].outputs[0].shape == seen[n], n
    assert g.outputs[0].shape == tuple(out.shape[1:])


def test_torch_reference_bottleneck_resnet():
    torch, ref = _torch_resnet("bottleneck", [1, 2, 1, 2], 11)
    g = resnet_bottleneck([1, 2, 1, 2], num_classes=11, in_shape=(3, 64, 64))
    assert param_shapes(g) == _torch_state_shapes(ref)
    assert g.num_params() == sum(p.numel() for p in ref.parameters())
    _compare_activation_shapes(torch, ref, g, (3, 64, 64),
                               ["conv1", "maxpool", "layer1.0.conv2", "layer2.0.conv2",
                                "layer2.0.downsample.0", "layer4.1.conv3"])


def test_torch_reference_resnet50_names():
    torch, ref = _torch_resnet("bottleneck", [3, 4, 6, 3], 1000)
    g = build_model("resnet50")
    assert param_shapes(g) == _torch_state_shapes(ref)


def test_torch_reference_basic_resnet():
    torch, ref = _torch_resnet("basic", [2, 2, 2, 2], 1000)
    assert param_shapes(build_model("resnet18")) == _torch_state_shapes(ref)


def test_torch_reference_resnet_cifar():
    torch, ref = _torch_resnet("basic", [3, 3, 3], 10, stem="cifar", widths=(16, 32, 64))
    g = build_model("resnet_cifar", depth=20)
    assert param_shapes(g) == _torch_state_shapes(ref)
    _compare_activation_shapes(torch, ref, g, (3, 32, 32),
                               ["conv1", "layer1.2.conv2", "layer2.0.conv1", "layer3.2.conv2"])


def _torch_densenet(block_config, growth, init, bn_size, num_classes, stem="imagenet"):
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class DenseLayer(nn.Module):
        def __init__(self, cin):
            super().__init__()
            self.norm1 = nn.BatchNorm2d(cin)
            self.relu1 = nn.ReLU()
            self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
            self.norm2 = nn.BatchNorm2d(bn_size * growth)
            self.relu2 = nn.ReLU()
            self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

        def forward(self, feats):
            x = torch.cat(feats, 1)
            return self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))

    class DenseBlock(nn.ModuleDict):
        def __init__(self, n, cin):
            super().__init__()
            for j in range(n):
                self.add_module(f"denselayer{j + 1}", DenseLayer(cin + j * growth))

        def forward(self, x):
            feats = [x]
            for layer in self.values():
                feats.append(layer(feats))
            return torch.cat(feats, 1)

    if stem == "imagenet":
        mods = [("conv0", nn.Conv2d(3, init, 7, 2, 3, bias=False)), ("norm0", nn.BatchNorm2d(init)),
                ("relu0", nn.ReLU()), ("pool0", nn.MaxPool2d(3, 2, 1))]
    else:
        mods = [("conv0", nn.Conv2d(3, init, 3, 1, 1, bias=False))]
    features = nn.Sequential(OrderedDict(mods))
    c = init
    for i, n in enumerate(block_config):
        features.add_module(f"denseblock{i + 1}", DenseBlock(n, c))
        c += n * growth
        if i != len(block_config) - 1:
            features.add_module(f"transition{i + 1}", nn.Sequential(OrderedDict([
                ("norm", nn.BatchNorm2d(c)), ("relu", nn.ReLU()),
                ("conv", nn.Conv2d(c, c // 2, 1, bias=False)), ("pool", nn.AvgPool2d(2, 2))])))
            c //= 2
    features.add_module("norm5", nn.BatchNorm2d(c))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = features
            self.classifier = nn.Linear(c, num_classes)

        def forward(self, x):
            x = torch.relu(self.features(x))
            return self.classifier(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return torch, Net()


def test_torch_reference_densenet121_names():
    torch, ref = _torch_densenet((6, 12, 24, 16), 32, 64, 4, 1000)
    assert param_shapes(build_model("densenet121")) == _torch_state_shapes(ref)


def test_torch_reference_small_densenet_shapes():
    torch, ref = _torch_densenet((2, 3, 2), 8, 16, 2, 4)
    g = densenet((2, 3, 2), 8, 16, bn_size=2, in_shape=(3, 64, 64), num_classes=4)
    assert param_shapes(g) == _torch_state_shapes(ref)
    _compare_activation_shapes(torch, ref, g, (3, 64, 64),
                               ["features.pool0", "features.denseblock2.denselayer3.conv2",
                                "features.transition1.pool", "features.transition2.conv",
                                "features.norm5"])


def test_torch_reference_vgg16_names():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    layers, c = [], 3
    for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"]:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU()]
            c = v
    ref = nn.Module()
    ref.features = nn.Sequential(*layers)
    ref.classifier = nn.Sequential(nn.Linear(512, 4096), nn.ReLU(), nn.Dropout(),
                                   nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(),
                                   nn.Linear(4096, 10))
    g = build_model("vgg16", in_shape=(3, 32, 32), num_classes=10)
    assert param_shapes(g) == _torch_state_shapes(ref)
