"""kernels/channels_last.py: recognising channels-last (N, H, W, C-stored) arrays, the
ambiguous shapes whose bytes are the same in both layouts, and their storage views."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.kernels.channels_last import (TO_LOGICAL, TO_STORAGE, channels_last_strides,
                                          is_channels_last, storage_permutation,
                                          storage_shape, storage_view)


def _channels_last(shape):
    n, c, h, w = shape
    return np.arange(n * c * h * w, dtype=np.float32).reshape(n, h, w, c).transpose(TO_LOGICAL)


def test_a_channels_last_view_is_recognised_and_described():
    a = _channels_last((2, 3, 4, 5))
    assert is_channels_last(a) and not a.flags.c_contiguous
    assert a.strides == channels_last_strides(a.shape, 4)
    assert storage_shape(a.shape) == (2, 4, 5, 3)
    assert storage_permutation(a) == TO_STORAGE
    s = storage_view(a)
    assert s.flags.c_contiguous and s.shape == (2, 4, 5, 3) and np.shares_memory(s, a)
    assert not is_channels_last(np.ascontiguousarray(a))
    assert storage_permutation(np.ascontiguousarray(a)) is None


@pytest.mark.parametrize("shape", [(2, 1, 4, 5), (2, 3, 1, 1), (1, 1, 1, 1)])
def test_shapes_with_the_same_bytes_in_both_layouts_count_as_c_ordered(shape):
    """C == 1 or H == W == 1: the storage is also the C-ordered array (NCHW is said)."""
    a = _channels_last(shape)
    assert a.flags.c_contiguous and not is_channels_last(a)
    assert storage_view(a) is a


def test_other_strides_are_one_error():
    a = np.zeros((2, 3, 4, 5), np.float32).transpose(0, 1, 3, 2)    # (N, C, W, H) storage
    assert not is_channels_last(a)
    with pytest.raises(ValueError, match=r"neither C-ordered nor channels-last \(--layout"):
        storage_permutation(a)
