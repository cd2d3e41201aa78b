"""How the `neuron` command fails: one line on stderr, never a traceback, and an exit code that
says whose move it is: 2 a usage error (fix the command line), 1 a runtime failure (the data, the
disk, the device, the numbers), 128+N stopped by signal N (the line says where the state is)."""
from __future__ import annotations

import errno
import os
import signal
import sys

# import name -> what to install
_PACKAGES = {"sklearn": "scikit-learn (pip install scikit-learn)",
             "matplotlib": "matplotlib (pip install 'neuron-arena[plot]', or in a checkout "
                           "pip install -e '.[plot]')",
             "cupy": "CuPy for CUDA 13 (pip install 'neuron-arena[cuda]', or in a checkout "
                     "pip install -e '.[cuda]')",
             "tqdm": "tqdm (pip install tqdm)"}

USAGE, RUNTIME = 2, 1


def classify(e: BaseException) -> int:
    """The exit code for an exception that ended a command."""
    from ..data import DataFormatError
    from ..errors import DataError, MemoryBudgetError, NonFiniteLossError, UsageError
    from ..data.image_folder import ImageFolderError
    if isinstance(e, (UsageError, MemoryBudgetError)):
        return USAGE                # a budget too small is known from the plan, before any work
    if isinstance(e, (DataFormatError, DataError, NonFiniteLossError, ImageFolderError)):
        return RUNTIME              # the data: an unreadable image, a folder of no images
    if isinstance(e, FileNotFoundError):
        return USAGE                # a path on the command line that names nothing
    if isinstance(e, (ValueError, KeyError, TypeError)):
        return USAGE
    return RUNTIME


def message(e: BaseException) -> str:
    if isinstance(e, ModuleNotFoundError) and e.name:
        top = e.name.split(".")[0]
        if top in _PACKAGES and "pip install" not in str(e):
            return f"this needs the Python package {_PACKAGES[top]}"
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, OSError) and e.strerror and e.filename and str(e.filename) not in str(e):
        return f"{e.filename}: {e.strerror}"
    text = str(e) or type(e).__name__
    return " ".join(text.split("\n"))


def _quiet_stdout() -> None:
    """After a broken pipe: the interpreter's final flush must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _ignore_further_signals() -> None:
    """The run is stopping and its state is saved: a second Ctrl-C arriving now must not turn
    the orderly exit into a KeyboardInterrupt at interpreter shutdown (exit status -2)."""
    from ..interrupt import SIGNALS
    for s in SIGNALS:
        try:
            signal.signal(s, signal.SIG_IGN)
        except ValueError:          # not the main thread
            pass


def run_command(name: str, fn, args, exiting: bool = False) -> int:
    """exiting: the process ends after this command (the console script), so a run that
    stops may stop listening to further signals; in-process callers keep their handlers."""
    from ..errors import TrainingStopped
    err = sys.stderr
    try:
        return fn(args)
    except TrainingStopped as e:
        if exiting:
            _ignore_further_signals()
        print(f"neuron {name}: {message(e)}", file=err)
        return 128 + e.signum if e.signum else RUNTIME
    except KeyboardInterrupt:
        if exiting:
            _ignore_further_signals()
        print(f"neuron {name}: interrupted", file=err)
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        print(f"neuron {name}: output closed early (broken pipe)", file=err)
        return RUNTIME
    except OSError as e:
        if e.filename is None and e.errno == errno.ENOSPC:   # stdout on a full disk
            _quiet_stdout()
            print(f"neuron {name}: error: cannot write the output ({e.strerror})", file=err)
            return RUNTIME
        print(f"neuron {name}: error: {message(e)}", file=err)
        return classify(e)
    except Exception as e:
        if os.environ.get("NEURON_TRACEBACK"):
            raise
        code = classify(e)
        internal = "" if _expected(e) else (" (unexpected: rerun with NEURON_TRACEBACK=1 and "
                                            "report the traceback)")
        print(f"neuron {name}: error: {message(e)}{internal}", file=err)
        return code


def _expected(e: BaseException) -> bool:
    from ..errors import NeuronError
    return isinstance(e, (NeuronError, ValueError, KeyError, TypeError, OSError, MemoryError,
                          ImportError, FloatingPointError))
