"""Independent references for the model tests: closed-form parameter counts, parameter shapes."""
from __future__ import annotations


def param_shapes(g) -> dict[str, tuple]:
    return {q: tuple(spec.shape) for q, _, _, spec in g.params()}


def layers_of(g, type_name):
    return [l for l in g.route if l.type_name == type_name]


# ---------------------------------------------------------------------------------------
# closed-form parameter counts (independent of the model code)
# ---------------------------------------------------------------------------------------
def bottleneck_resnet_params(blocks, num_classes=1000, in_ch=3) -> int:
    """ImageNet bottleneck ResNet: 7x7 stem (no bias) + BN, stage i of width w = 64*2^i.

    A block is 1x1 (c->w) + 3x3 (w->w) + 1x1 (w->4w), each conv followed by a BN (2 trainable
    params per channel): 12w BN params. Every stage's first block has a projection
    (1x1 c->4w + BN) because c != 4w; later blocks have c = 4w, i.e. 17 w^2 + 12 w params.
    """
    total = in_ch * 64 * 7 * 7 + 2 * 64
    c = 64
    for i, n in enumerate(blocks):
        w = 64 * 2 ** i
        first = c * w + 9 * w * w + 4 * w * w + 12 * w + c * 4 * w + 8 * w
        total += first + (n - 1) * (17 * w * w + 12 * w)
        c = 4 * w
    return total + c * num_classes + num_classes


def basic_resnet_params(blocks, widths, stem, num_classes, in_ch=3) -> int:
    """Basic-block ResNet: two 3x3 convs + 2 BNs per block, option-B projection when the
    width changes or the stage strides (every stage but the first)."""
    stem_out = widths[0]
    k = 7 if stem == "imagenet" else 3
    total = in_ch * stem_out * k * k + 2 * stem_out
    c = stem_out
    for i, (n, w) in enumerate(zip(blocks, widths)):
        for j in range(n):
            total += 9 * c * w + 9 * w * w + 4 * w
            if j == 0 and (i > 0 or c != w):
                total += c * w + 2 * w
            c = w
    return total + c * num_classes + num_classes


def resnet_cifar_params(depth, num_classes=10) -> int:
    """Closed form for 6n+2 with option-B shortcuts: 3 stages of n blocks, 16/32/64."""
    n = (depth - 2) // 6
    stem = 3 * 16 * 9 + 2 * 16
    stages = sum(n * (18 * w * w + 4 * w) for w in (16, 32, 64))
    first_conv_fix = (9 * 16 * 32 - 9 * 32 * 32) + (9 * 32 * 64 - 9 * 64 * 64)
    shortcuts = (16 * 32 + 2 * 32) + (32 * 64 + 2 * 64)
    return stem + stages + first_conv_fix + shortcuts + 64 * num_classes + num_classes


def densenet_params(block_config, growth, init, bn_size=4, num_classes=1000, stem="imagenet"):
    if stem == "imagenet":
        total, c = 3 * init * 49 + 2 * init, init
    else:
        total, c = 3 * init * 9, init
    for i, n in enumerate(block_config):
        for _ in range(n):
            total += 2 * c + c * bn_size * growth + 2 * bn_size * growth \
                + bn_size * growth * growth * 9
            c += growth
        if i != len(block_config) - 1:
            total += 2 * c + c * (c // 2)
            c //= 2
    return total + 2 * c + c * num_classes + num_classes
