"""Every error neuron raises on bad input or an impossible plan; each names what was wrong."""


class NeuronError(Exception):
    pass


class GraphError(NeuronError, ValueError):
    """A network that cannot be built: wrong shapes, cycles, dangling layers, bad arguments."""


class ShapeError(GraphError):
    pass


class MemoryBudgetError(NeuronError, MemoryError):
    """A plan that does not fit the arena: names the step, tensor and bytes short."""

    def __init__(self, message: str, *, step=None, tensor=None, requested=0, largest_free=0,
                 free_bytes=0, budget=0):
        super().__init__(message)
        self.step, self.tensor = step, tensor
        self.requested, self.largest_free, self.free_bytes = requested, largest_free, free_bytes
        self.budget = budget
        self.short = max(0, requested - largest_free)


class NonFiniteLossError(NeuronError, FloatingPointError):
    pass


class NonFiniteUpdateError(NonFiniteLossError):
    """A step whose gradients, updates or BN statistics went NaN or infinite (undone whole)."""


class DataError(NeuronError, ValueError):
    """A batch that does not match the network (shape, dtype, label range)."""


class UsageError(NeuronError, ValueError):
    """An argument that cannot work (the CLI exits 2): names it and what would work."""


class TrainingStopped(NeuronError, RuntimeError):
    """A run that ended early (a signal, a refused step, a failed write); the message says
    where the state is. ``signum`` is the signal that stopped it, if any."""

    def __init__(self, message: str, *, iteration: int, checkpoint=None, signum=None,
                 result=None):
        super().__init__(message)
        self.iteration, self.checkpoint, self.signum = iteration, checkpoint, signum
        self.result = result


class DeviceUnavailableError(NeuronError, RuntimeError):
    """A device asked for by name that this machine cannot provide."""
