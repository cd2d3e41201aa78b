"""AlexNet as drawn in the SuperNeurons paper (Wang et al., PPoPP'18, Fig. 1).

CONV1 -> RELU1 -> LRN1 -> POOL1 -> CONV2 -> RELU2 -> LRN2 -> POOL2 -> CONV3 -> RELU3 -> CONV4 ->
RELU4 -> CONV5 -> RELU5 -> POOL5 -> FC1 -> RELU6 -> DROPOUT6 -> FC2 -> RELU7 -> DROPOUT7 -> FC3.
The softmax loss is attached by the executor. Single tower (groups=1, no two-GPU split), so
with 1000 classes and the paper's 227x227 input it has 62,378,344 parameters.

LRN: Krizhevsky et al. normalize with ``k + alpha * sum(x^2)`` (n=5, alpha=1e-4, beta=0.75,
k=2). neuron's LRN follows torch.nn.LocalResponseNorm / cuDNN / Caffe and divides alpha by the
window size, so the paper's alpha=1e-4 is passed as ``alpha = 1e-4 * 5 = 5e-4``: the layer then
computes exactly the paper's ``x / (2 + 1e-4 * sum(x^2)) ** 0.75``. (Caffe's bvlc_alexnet,
which uses alpha=1e-4 with the division and k=1, is ``lrn=dict(alpha=1e-4, k=1.0)``.)

Pools are 3x3/2 with floor rounding (227 -> 55 -> 27 -> 13 -> 6): FC1 sees 256*6*6 = 9216.
Layer names: conv1..conv5, relu1..relu7, lrn1, lrn2, pool1, pool2, pool5, fc1..fc3, drop6, drop7.
"""
from __future__ import annotations

from ..layers import LRN, Conv2d, Dropout, Linear, MaxPool2d, ReLU
from ._common import check_in_shape, check_num_classes, data, graph

#: the paper's LRN in neuron's (torch/cuDNN) convention: alpha is divided by ``size``
LRN_PAPER = dict(size=5, alpha=5e-4, beta=0.75, k=2.0)


def alexnet(num_classes: int = 1000, in_shape=(3, 227, 227), *, dropout: float = 0.5,
            lrn: dict | None = None):
    """The SuperNeurons AlexNet. ``lrn`` overrides entries of :data:`LRN_PAPER`."""
    in_shape = check_in_shape(in_shape, "alexnet")
    num_classes = check_num_classes(num_classes, "alexnet")
    lrn_args = {**LRN_PAPER, **(lrn or {})}
    x = data(in_shape)
    h = Conv2d(96, 11, stride=4, name="conv1")(x)
    h = ReLU(name="relu1")(h)
    h = LRN(**lrn_args, name="lrn1")(h)
    h = MaxPool2d(3, 2, name="pool1")(h)
    h = Conv2d(256, 5, padding=2, name="conv2")(h)
    h = ReLU(name="relu2")(h)
    h = LRN(**lrn_args, name="lrn2")(h)
    h = MaxPool2d(3, 2, name="pool2")(h)
    h = ReLU(name="relu3")(Conv2d(384, 3, padding=1, name="conv3")(h))
    h = ReLU(name="relu4")(Conv2d(384, 3, padding=1, name="conv4")(h))
    h = ReLU(name="relu5")(Conv2d(256, 3, padding=1, name="conv5")(h))
    h = MaxPool2d(3, 2, name="pool5")(h)
    h = ReLU(name="relu6")(Linear(4096, name="fc1")(h))
    h = Dropout(dropout, name="drop6")(h)
    h = ReLU(name="relu7")(Linear(4096, name="fc2")(h))
    h = Dropout(dropout, name="drop7")(h)
    logits = Linear(num_classes, name="fc3")(h)
    return graph(x, logits, "alexnet")
