"""Model zoo: registry, output shapes, parameter counts, torchvision/timm names.

Parameter counts are checked against the published torchvision/timm numbers and against
closed-form formulas written here from the architectures, independently of neuron.models.
If torch is importable, small torchvision-structured reference modules are built by hand and
their state_dict names/shapes (and activation shapes) are compared with ours
(test_models_torch_reference.py).
"""
from __future__ import annotations

import re
import time

import pytest

import neuron
from models_reference import (basic_resnet_params, bottleneck_resnet_params, densenet_params,
                              layers_of, param_shapes, resnet_cifar_params)
from neuron.models import MODELS, build_model, model_names
from neuron.models.densenet import densenet, densenet_cifar
from neuron.models.resnet import (resnet, resnet_basic, resnet_bottleneck, resnet_cifar,
                                  table4_blocks)


# ---------------------------------------------------------------------------------------
# published counts
# ---------------------------------------------------------------------------------------
TORCHVISION = {
    "resnet18": 11_689_512, "resnet34": 21_797_672,
    "resnet50": 25_557_032, "resnet101": 44_549_160, "resnet152": 60_192_808,
    "densenet121": 7_978_856, "densenet161": 28_681_000,
    "densenet169": 14_149_480, "densenet201": 20_013_928,
    "vgg11": 132_863_336, "vgg13": 133_047_848, "vgg16": 138_357_544, "vgg19": 143_667_240,
    "vgg16_bn": 138_365_992,
    "inception_v4": 42_679_816,         # timm
    "alexnet": 62_378_344,              # single-tower AlexNet (groups=1), 227x227
}


@pytest.mark.parametrize("name", sorted(TORCHVISION))
def test_published_param_counts(name):
    g = build_model(name)
    assert g.num_params() == TORCHVISION[name]
    assert g.outputs[0].shape == (1000,)


@pytest.mark.parametrize("name,blocks", [("resnet50", [3, 4, 6, 3]),
                                         ("resnet101", [3, 4, 23, 3]),
                                         ("resnet152", [3, 8, 36, 3])])
def test_bottleneck_formula_reproduces_torchvision(name, blocks):
    assert bottleneck_resnet_params(blocks) == TORCHVISION[name]
    assert resnet_bottleneck(blocks).num_params() == TORCHVISION[name]


def test_basic_formula_reproduces_torchvision():
    w = (64, 128, 256, 512)
    assert basic_resnet_params([2, 2, 2, 2], w, "imagenet", 1000) == TORCHVISION["resnet18"]
    assert basic_resnet_params([3, 4, 6, 3], w, "imagenet", 1000) == TORCHVISION["resnet34"]


@pytest.mark.parametrize("cfg,growth,init,name", [((6, 12, 24, 16), 32, 64, "densenet121"),
                                                  ((6, 12, 36, 24), 48, 96, "densenet161"),
                                                  ((6, 12, 32, 32), 32, 64, "densenet169"),
                                                  ((6, 12, 48, 32), 32, 64, "densenet201")])
def test_densenet_formula_reproduces_torchvision(cfg, growth, init, name):
    assert densenet_params(cfg, growth, init) == TORCHVISION[name]


def test_densenet264():
    g = build_model("densenet264")
    assert g.num_params() == densenet_params((6, 12, 64, 48), 32, 64) == 33_337_704
    assert g.outputs[0].shape == (1000,)


# ---------------------------------------------------------------------------------------
# SuperNeurons Table 4 ResNets
# ---------------------------------------------------------------------------------------
def test_table4_blocks():
    assert table4_blocks(1919) == [6, 32, 595, 6]
    assert table4_blocks(137) == [6, 32, 1, 6]
    for depth in (137, 152, 500, 1001):
        n1, n2, n3, n4 = table4_blocks(depth)
        assert 3 * (n1 + n2 + n3 + n4) + 2 == depth


@pytest.mark.parametrize("depth", [137, 152, 503, 1919])
def test_table4_param_counts(depth):
    n3 = (depth - 2) // 3 - 44
    g = build_model("resnet", depth=depth, in_shape=(3, 64, 64))     # params don't depend on HxW
    assert g.num_params() == bottleneck_resnet_params([6, 32, n3, 6])
    assert g.outputs[0].shape == (1000,)
    assert g.name == f"resnet{depth}"


def test_table4_depth_1919_builds_fast():
    t0 = time.perf_counter()
    g = build_model("resnet", depth=1919)
    elapsed = time.perf_counter() - t0
    assert elapsed < 10.0, f"building ResNet-1919 took {elapsed:.1f} s"
    convs = layers_of(g, "Conv")
    # 3 convs per block, 639 blocks, conv1, 4 projections
    assert len(convs) == 3 * 639 + 1 + 4
    assert len(g) > 5_500
    assert g.num_params() == bottleneck_resnet_params([6, 32, 595, 6]) == 705_019_176
    assert "layer3.594.bn3.running_var" in param_shapes(g)


@pytest.mark.parametrize("depth,lo,hi", [(1920, 1919, 1922), (1918, 1916, 1919),
                                         (100, 137, 140), (138, 137, 140)])
def test_table4_invalid_depth_names_neighbours(depth, lo, hi):
    with pytest.raises(ValueError, match=rf"\b{lo}\b.*\b{hi}\b"):
        build_model("resnet", depth=depth)
    with pytest.raises(ValueError):
        resnet(depth)


# ---------------------------------------------------------------------------------------
# CIFAR ResNets
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [8, 20, 32, 44, 56, 110])
def test_resnet_cifar_params(depth):
    g = build_model("resnet_cifar", depth=depth)
    expect = resnet_cifar_params(depth)
    n = (depth - 2) // 6
    assert expect == basic_resnet_params([n] * 3, (16, 32, 64), "cifar", 10)
    assert g.num_params() == expect
    assert g.outputs[0].shape == (10,)
    assert len(layers_of(g, "Conv")) == depth - 1 + 2      # depth-2 block convs, conv1, 2 proj
    assert len(layers_of(g, "FC")) == 1


def test_resnet20_cifar_count():
    assert build_model("resnet_cifar", depth=20).num_params() == 272_474
    # option A (parameter-free zero-padding) would be 269,722: the two projections differ
    assert 272_474 - (16 * 32 + 64) - (32 * 64 + 128) == 269_722


def test_resnet1202_cifar_builds():
    g = resnet_cifar(1202)
    assert g.num_params() == resnet_cifar_params(1202)


@pytest.mark.parametrize("depth,lo,hi", [(21, 20, 26), (5, 8, 14), (111, 110, 116),
                                         (1201, 1196, 1202)])
def test_resnet_cifar_invalid_depth(depth, lo, hi):
    with pytest.raises(ValueError, match=rf"\b{lo}\b and \b{hi}\b"):
        build_model("resnet_cifar", depth=depth)


def test_resnet_cifar_shortcut_is_option_b():
    p = param_shapes(resnet_cifar(20))
    assert p["layer2.0.downsample.0.weight"] == (32, 16, 1, 1)
    assert p["layer3.0.downsample.1.weight"] == (64,)
    assert "layer1.0.downsample.0.weight" not in p
    assert "layer2.1.downsample.0.weight" not in p


# ---------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------
def test_resnet50_torchvision_names():
    p = param_shapes(build_model("resnet50"))
    expected = {
        "conv1.weight": (64, 3, 7, 7), "bn1.weight": (64,), "bn1.running_mean": (64,),
        "layer1.0.conv1.weight": (64, 64, 1, 1), "layer1.0.conv2.weight": (64, 64, 3, 3),
        "layer1.0.conv3.weight": (256, 64, 1, 1),
        "layer1.0.downsample.0.weight": (256, 64, 1, 1), "layer1.0.downsample.1.bias": (256,),
        "layer2.0.conv2.weight": (128, 128, 3, 3), "layer2.0.downsample.0.weight": (512, 256, 1, 1),
        "layer3.5.bn3.weight": (1024,), "layer4.2.bn3.running_var": (2048,),
        "fc.weight": (1000, 2048), "fc.bias": (1000,),
    }
    for k, v in expected.items():
        assert p[k] == v, k
    assert not any(k.endswith(".bias") and ("conv" in k or "downsample.0" in k) for k in p)
    # torchvision's state_dict has exactly these keys (plus BN num_batches_tracked)
    assert len(p) == 320 - 53
    for k in p:
        assert re.fullmatch(r"(conv1|bn1|fc|layer[1-4]\.\d+\.(conv[1-3]|bn[1-3]|downsample\.[01]))"
                            r"\.(weight|bias|running_mean|running_var)", k), k


def test_resnet_v15_stride_on_3x3():
    g = build_model("resnet50")
    assert g.layers["layer2.0.conv1"].stride == (1, 1)
    assert g.layers["layer2.0.conv2"].stride == (2, 2)
    assert g.layers["layer2.0.downsample.0"].stride == (2, 2)
    assert g.layers["layer4.2.add"].outputs[0].shape == (2048, 7, 7)


def test_densenet_torchvision_names_and_full_join():
    g = build_model("densenet121")
    p = param_shapes(g)
    for k, v in {"features.conv0.weight": (64, 3, 7, 7), "features.norm0.running_var": (64,),
                 "features.denseblock1.denselayer1.norm1.weight": (64,),
                 "features.denseblock1.denselayer1.conv1.weight": (128, 64, 1, 1),
                 "features.denseblock1.denselayer1.conv2.weight": (32, 128, 3, 3),
                 "features.denseblock1.denselayer6.norm1.weight": (64 + 5 * 32,),
                 "features.transition1.norm.weight": (256,),
                 "features.transition1.conv.weight": (128, 256, 1, 1),
                 "features.denseblock4.denselayer16.conv2.weight": (32, 128, 3, 3),
                 "features.norm5.bias": (1024,), "classifier.weight": (1000, 1024),
                 "classifier.bias": (1000,)}.items():
        assert p[k] == v, k
    # dense layer j of a block reads the concat of the block input and layers 1..j-1
    for j in range(2, 25):
        cat = g.layers[f"features.denseblock3.denselayer{j}.concat"]
        assert len(cat.inputs) == j
        assert cat.inputs[0] is g.layers["features.transition2.pool"].outputs[0]
        assert g.layers[f"features.denseblock3.denselayer{j}.norm1"].inputs[0] is cat.outputs[0]
    assert len(g.layers["features.denseblock3.concat"].inputs) == 25
    assert len(layers_of(g, "Concat")) == (5 + 11 + 23 + 15) + 4
    assert not any(k.endswith("bias") and ".conv" in k for k in p)


@pytest.mark.parametrize("depth,expect", [(40, None), (100, 769_162)])
def test_densenet_cifar(depth, expect):
    g = build_model("densenet_cifar", depth=depth)
    n = (depth - 4) // 6
    count = densenet_params((n, n, n), 12, 24, num_classes=10, stem="cifar")
    assert g.num_params() == count
    if expect:
        assert count == expect
    assert g.outputs[0].shape == (10,)
    assert g.layers["features.conv0"].kernel == (3, 3)
    assert "features.pool0" not in g.layers
    assert g.layers["features.norm5"].outputs[0].shape[1:] == (8, 8)


def test_densenet_cifar_default_depth_and_invalid():
    assert build_model("densenet_cifar").name == "densenet100_cifar"
    with pytest.raises(ValueError, match=r"\b40\b and \b46\b"):
        densenet_cifar(41)


def test_densenet_general_builder():
    g = densenet((2, 3), growth_rate=8, num_init_features=16, bn_size=2, compression=0.5,
                 in_shape=(3, 32, 32), num_classes=5, stem="cifar")
    assert g.outputs[0].shape == (5,)
    assert g.num_params() == densenet_params((2, 3), 8, 16, 2, 5, stem="cifar")


def test_vgg16_names():
    p = param_shapes(build_model("vgg16"))
    convs = [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28]
    assert sorted(int(k.split(".")[1]) for k in p if k.startswith("features")
                  and k.endswith("weight")) == convs
    assert p["features.0.weight"] == (64, 3, 3, 3) and p["features.0.bias"] == (64,)
    assert p["features.28.weight"] == (512, 512, 3, 3)
    assert p["classifier.0.weight"] == (4096, 25088)
    assert p["classifier.3.weight"] == (4096, 4096)
    assert p["classifier.6.bias"] == (1000,)
    assert len(p) == 32


def test_vgg_small_input():
    g = build_model("vgg16", in_shape=(3, 32, 32), num_classes=10)
    assert g.outputs[0].shape == (10,)
    assert param_shapes(g)["classifier.0.weight"] == (4096, 512)


def test_alexnet_structure():
    g = build_model("alexnet")
    order = [l.name for l in g.route]
    assert order == ["data", "conv1", "relu1", "lrn1", "pool1", "conv2", "relu2", "lrn2", "pool2",
                     "conv3", "relu3", "conv4", "relu4", "conv5", "relu5", "pool5",
                     "fc1", "relu6", "drop6", "fc2", "relu7", "drop7", "fc3"]
    assert g.layers["pool5"].outputs[0].shape == (256, 6, 6)
    lrn = g.layers["lrn1"]
    # paper: x / (2 + 1e-4 * sum x^2)^0.75; neuron's LRN divides alpha by size
    assert (lrn.size, lrn.beta, lrn.k) == (5, 0.75, 2.0)
    assert lrn.alpha / lrn.size == pytest.approx(1e-4)
    assert g.layers["drop6"].p == 0.5
    assert g.layers["conv1"].stride == (4, 4)
    assert param_shapes(g)["fc1.weight"] == (4096, 9216)


def test_inception_v4_structure():
    g = build_model("inception_v4")
    p = param_shapes(g)
    for k, v in {"features.0.conv.weight": (32, 3, 3, 3), "features.0.bn.running_var": (32,),
                 "features.3.conv.conv.weight": (96, 64, 3, 3),
                 "features.4.branch1.1.conv.weight": (64, 64, 1, 7),
                 "features.6.branch3.1.conv.weight": (96, 384, 1, 1),
                 "features.10.branch1.2.conv.weight": (256, 224, 3, 3),
                 "features.17.branch2.4.conv.weight": (256, 224, 1, 7),
                 "features.18.branch1.3.conv.weight": (320, 320, 3, 3),
                 "features.21.branch2_3b.bn.weight": (256,),
                 "last_linear.weight": (1000, 1536), "last_linear.bias": (1000,)}.items():
        assert p[k] == v, k
    assert g.layers["features.21.concat"].outputs[0].shape == (1536, 8, 8)
    assert g.layers["features.9.concat"].outputs[0].shape == (384, 35, 35)
    assert g.layers["features.17.concat"].outputs[0].shape == (1024, 17, 17)
    bns = layers_of(g, "BN")
    assert bns and all(b.eps == 1e-3 and b.momentum == 0.1 for b in bns)
    assert all(not c.bias for c in layers_of(g, "Conv"))
    assert len(layers_of(g, "Conv")) == 149
    assert g.layers["head_drop"].p == 0.2


# ---------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------
DEPTH = {"resnet": 137, "resnet_cifar": 20}


def test_model_names():
    names = model_names()
    assert names == sorted(MODELS)
    for n in ("alexnet", "vgg16", "resnet50", "resnet101", "resnet152", "resnet", "resnet_cifar",
              "densenet121", "densenet169", "densenet201", "densenet264", "densenet_cifar",
              "inception_v4"):
        assert n in names


@pytest.mark.parametrize("name", model_names())
def test_every_model_builds_with_defaults(name):
    g = build_model(name, depth=DEPTH.get(name))
    spec = MODELS[name]
    assert isinstance(g, neuron.Graph)
    assert g.outputs[0].shape == (spec.num_classes,)
    assert [t.producer.name for t in g.inputs] == ["data"]
    assert g.inputs[0].shape == spec.in_shape
    names = [q for q, *_ in g.params()]
    assert len(names) == len(set(names))
    bns = [l for l in layers_of(g, "BN")]
    if name != "inception_v4":
        assert all(b.eps == 1e-5 and b.momentum == 0.1 for b in bns)


@pytest.mark.parametrize("name,shape", [("resnet50", (3, 64, 64)), ("densenet121", (3, 64, 64)),
                                        ("resnet_cifar", (1, 28, 28)), ("alexnet", (3, 227, 227)),
                                        ("inception_v4", (3, 75, 75))])
def test_num_classes_and_in_shape(name, shape):
    g = build_model(name, depth=DEPTH.get(name), num_classes=7, in_shape=shape)
    assert g.outputs[0].shape == (7,)
    assert g.inputs[0].shape == shape


def test_default_shapes():
    assert MODELS["alexnet"].in_shape == (3, 227, 227)
    assert MODELS["resnet50"].in_shape == (3, 224, 224) and MODELS["resnet50"].num_classes == 1000
    assert MODELS["resnet_cifar"].in_shape == (3, 32, 32)
    assert MODELS["resnet_cifar"].num_classes == 10
    assert MODELS["inception_v4"].in_shape == (3, 299, 299)


def test_registry_errors():
    with pytest.raises(ValueError, match="resnet50") as e:
        build_model("resnet51")
    assert "densenet121" in str(e.value) and "inception_v4" in str(e.value)
    with pytest.raises(ValueError, match="takes no depth"):
        build_model("resnet50", depth=50)
    with pytest.raises(ValueError, match="needs a depth"):
        build_model("resnet")
    with pytest.raises(ValueError, match="needs a depth"):
        build_model("resnet_cifar")
    with pytest.raises(ValueError):
        build_model("resnet_cifar", depth=20, num_classes=0)
    with pytest.raises(ValueError):
        build_model("resnet_cifar", depth=20, in_shape=(32, 32))
    with pytest.raises(ValueError):
        build_model("resnet_cifar", depth=20.0)
    with pytest.raises(ValueError):
        build_model("inception_v4", in_shape=(3, 74, 74))    # too small for the stem


def test_general_builders():
    g = resnet_bottleneck([1, 1, 1, 1], num_classes=3, in_shape=(3, 32, 32))
    assert g.num_params() == bottleneck_resnet_params([1, 1, 1, 1], 3)
    g = resnet_basic([1, 2, 1, 1], num_classes=3, in_shape=(3, 32, 32))
    assert g.num_params() == basic_resnet_params([1, 2, 1, 1], (64, 128, 256, 512), "imagenet", 3)
    with pytest.raises(ValueError):
        resnet_bottleneck([3, 4, 6])
