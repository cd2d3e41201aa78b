"""The order of an epoch: a permutation that is a pure function of (seed, epoch), so that a
run's step k is the same whatever loader serves it (data.py's arrays, image_folder.py's
decoding threads) and a resumed run sees the batches it would have seen."""
from __future__ import annotations

import numpy as np


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The sample indices 0..n-1 in the order of ``epoch`` for ``seed``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch]))
    return rng.permutation(n)


def epoch_batches(n: int, batch: int, seed: int, start_step: int = 0):
    """Forever, from step ``start_step``: (that epoch's order, start index) of each full batch
    (the last partial batch of an epoch dropped); step k a pure function of (seed, k)."""
    spe = n // batch
    epoch, j = divmod(int(start_step), spe)
    while True:
        order = epoch_permutation(n, seed, epoch)
        for i in range(j * batch, spe * batch, batch):
            yield order, i
        epoch += 1
        j = 0
