import os
import sys

# `import neuron` from this checkout, and the shared test networks (dp_nets) for the tests
_HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.abspath(os.path.join(_HERE, os.pardir, os.pardir)), _HERE):
    if p not in sys.path:
        sys.path.insert(0, p)
