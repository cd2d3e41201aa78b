"""The tape as one CUDA graph: a trusted tape (neuron/tape.py) captured on the compute stream
and launched once per iteration, so the host issues one call instead of every kernel.

What a replay did on the host becomes device work inside the capture: the batch is copied
from pinned staging buffers the executor fills before each launch; each loss's per-row values
are copied to a fixed device buffer and averaged on the host after the launch (as the eager
kernel does); a host wait for an event (or for a copy) becomes every stream waiting for it.
The side streams join the compute stream before the capture ends. An operation that must block
the host cannot be captured: the executor then replays the tape instead, saying why
(``GraphUnavailable``).

What changes per iteration is read by the kernels from device buffers written before each
launch: the learning rate (``sgd_update(neg_lr_buffer=)``, and ``sgd_update_many``'s) and
each dropout layer's key (``dropout_forward(key_buffer=)``); any other Varying argument is
fixed in a captured graph, which is captured again when it changes.
"""
from __future__ import annotations

import numpy as np

from ..kernels.channels_last import TO_STORAGE, is_channels_last
from ..recording import Varying
from ..tape import map_args


class GraphUnavailable(RuntimeError):
    """The tape cannot become a CUDA graph on this device (the reason says why)."""


class GraphReplay:
    """Captures ``tape`` on ``device`` and launches it; ``staging``: the executor's batch
    buffers (pinned host memory), which the tape's input copies read."""

    def __init__(self, device, tape, staging: dict):
        if not getattr(device, "graph_replay", False):
            raise GraphUnavailable(f"{device.name} does not capture CUDA graphs")
        self.device, self.tape = device, tape
        self._staging = [_span(a) for a in staging.values()]
        self._sinks: dict[int, object] = {}     # loss op index -> device buffer of its rows
        # key -> (one-element device buffer, its pinned host staging, iteration -> its value)
        self._scalars: dict[tuple, tuple] = {}
        # (pinned buffer in a channels-last input's storage order, its staging buffer)
        self._reordered: list[tuple] = []
        self._ops = self._capturable_ops()
        self._varying = _varying_args(self._ops)    # the values still baked into the graph
        self._values = None             # ... as they were at its capture
        self.graph = None
        self.captures = self.launches = 0
        self.launched_now = False

    def run(self, iteration: int) -> list:
        """This iteration's work, through the graph; the results a replay returns (the losses;
        every other op's result is None). Blocks until the graph has run."""
        self.launched_now = False
        values = [v.resolve(iteration) for v in self._varying]
        if self.graph is None or values != self._values:
            self._capture(iteration)
            self._values = values
        for buf, host, value in self._scalars.values():  # this iteration's lr and keys
            host[0] = value(iteration)
            self.device.upload(buf, host)
        for buf, staged in self._reordered:     # this iteration's batch, channels-last
            np.copyto(buf, staged.transpose(TO_STORAGE))
        self.launched_now = True        # from here the whole graph runs, or a part of it
        self.device.launch(self.graph)
        self.launches += 1
        results = [None] * len(self.tape.ops)
        for i, sink in self._sinks.items():
            results[i] = _mean_loss(sink)
        return results

    # ---- capture -----------------------------------------------------------------------
    def _capture(self, iteration: int) -> None:
        dev, tape, ops = self.device, self.tape, self._ops

        def work():
            with dev.replaying_temporaries(tape.temporaries):
                tape.run_ops(ops, iteration)
        try:
            self.graph = dev.capture(work)
        except GraphUnavailable:
            raise
        except Exception as e:
            raise GraphUnavailable(f"capturing the tape failed: {type(e).__name__}: {e}") from e
        self.captures += 1

    def _capturable_ops(self) -> list:
        """The tape's operations with the host's part moved to the device (module docstring)."""
        dev, k = self.device, self.device.kernels
        out = []
        for i, (fn, args, kw, flags) in enumerate(self.tape.ops):
            name = getattr(fn, "__name__", "")
            if getattr(fn, "collective", False):
                raise GraphUnavailable(
                    f"operation {i} ({name}) is a data-parallel collective, a host call between "
                    "the iteration's kernels: the tape replays it in its place")
            if fn is getattr(k, "copy", None) and len(args) == 2 and \
                    isinstance(args[1], np.ndarray) and not isinstance(args[1], dev.cupy.ndarray):
                if not self._staged(args[1]):
                    raise GraphUnavailable(
                        f"operation {i} copies host memory that is not the batch's staging "
                        f"(a {args[1].dtype} array of shape {args[1].shape}): a graph would "
                        "replay the bytes it held at the capture")
                fn = dev.upload                 # the batch, or a chunk of it, from staging
                args = self._storage_order(*args)
            elif name == "softmax_xent_forward" and kw.get("sink") is not None:
                self._sinks[i] = kw["sink"]     # its rows already go to a fixed buffer
            elif name == "softmax_xent_forward":
                fn = self._loss_into_sink(i)
            elif name == "synchronize":
                raise GraphUnavailable("the iteration waits for the whole device (synchronize)")
            elif name == "wait":
                fn = dev.order_after
            elif name in ("copy_to_host", "copy_to_device"):
                # a copy the host waited for: in a graph, later work waits for it instead
                fn = getattr(dev, name + "_captured", fn)
            elif name == "sgd_update" and len(args) > 3 and isinstance(args[3], Varying):
                args, kw = args[:3] + (0.0,) + args[4:], dict(kw, neg_lr_buffer=self._lr_buffer(
                    args[0].dtype, args[3]))    # the learning rate from a device buffer
            elif name == "sgd_update_many" and len(args) > 3 and isinstance(args[3], Varying):
                args, kw = args[:3] + (0.0,) + args[4:], dict(kw, neg_lr_buffer=self._lr_buffer(
                    args[0][0].dtype, args[3]))     # its tensors share a dtype (optim.py)
            elif name == "dropout_forward" and len(args) > 4 and isinstance(args[4], Varying):
                args, kw = args[:4] + (0,) + args[5:], dict(kw, key_buffer=self._key_buffer(
                    args[4]))                   # the mask's key from a device buffer
            elif name == "nonfinite_flag_read":
                fn = _nothing                   # read after the launch
            out.append((fn, args, kw, flags))
        return out

    def _storage_order(self, dst, src) -> tuple:
        """(dst, src) of a batch copy as bytes: as they are, or for a channels-last ``dst``
        (--layout nhwc) its storage view and a pinned buffer that ``run`` fills in that order
        from the (N, C, H, W) staging before each launch (the eager copy transposes on the
        host too: kernels/cuda.py copy). A graph copies bytes; the staging's NCHW bytes would
        land in an NHWC tensor transposed."""
        if not is_channels_last(dst) or src.shape != dst.shape:
            return dst, src
        store = dst.transpose(TO_STORAGE)
        if is_channels_last(src):       # the executor's staging is in storage order already
            return store, src.transpose(TO_STORAGE)
        buf = self.device.staging_array(store.shape, src.dtype)
        self._reordered.append((buf, src))
        return store, buf

    def _staged(self, a: np.ndarray) -> bool:
        """Whether ``a`` is (a contiguous part of) one of the executor's staging buffers, or
        one whole in storage order (a channels-last view: --layout nhwc)."""
        lo, hi = _span(a)
        return (a.flags.c_contiguous or is_channels_last(a)) and any(s_lo <= lo and hi <= s_hi
                                            for s_lo, s_hi in self._staging)

    def _scalar(self, key, dtype, value):
        """A one-element device buffer written with ``value(iteration)`` before each launch."""
        if key not in self._scalars:
            self._scalars[key] = (self.device.fixed_array((1,), dtype),
                                  self.device.staging_array((1,), dtype), value)
        return self._scalars[key][0]

    def _lr_buffer(self, dtype, lr):
        dtype = np.dtype(dtype)
        return self._scalar(("lr", str(dtype)), dtype,
                            lambda iteration: -dtype.type(lr.resolve(iteration)))

    def _key_buffer(self, seed):
        key_of = self.device.kernels.dropout_key
        return self._scalar(("dropout", id(seed)), np.uint64,
                            lambda iteration: np.uint64(key_of(seed.resolve(iteration))))

    def _loss_into_sink(self, index: int):
        dev, k = self.device, self.device.kernels
        fn, args, kw, _ = self.tape.ops[index]
        rows = kw.get("rows", args[3] if len(args) > 3 else None)
        if rows is None:
            raise GraphUnavailable("a loss without its per-row output cannot be captured")
        if index not in self._sinks:    # outside the arena and the capture: kept across them
            self._sinks[index] = dev.fixed_array(rows.shape, rows.dtype)
        sink = self._sinks[index]

        def loss_rows(logits, labels, probs, rows=None):
            k.softmax_xent_rows(logits, labels, probs, rows)
            dev.cupy.copyto(sink, rows)
        loss_rows.__name__ = "softmax_xent_rows"
        return loss_rows


def _span(a: np.ndarray) -> tuple[int, int]:
    lo = int(a.__array_interface__["data"][0])
    return lo, lo + a.nbytes


def _nothing(*args, **kwargs):
    return None


def _mean_loss(rows) -> float:
    """The eager kernel's mean of the per-row losses (kernels/cuda.softmax_xent_forward)."""
    return float(np.mean(rows.get().astype(np.float64)))


def _varying_args(ops) -> list:
    """The Varying arguments of ``ops``, in order (the values a captured graph fixes)."""
    found = []

    def leaf(x):
        if isinstance(x, Varying):
            found.append(x)
        return x
    for _, args, kw, flags in ops:
        if flags:
            map_args((args, kw), leaf)
    return found
