"""The README's layer-API example runs as printed."""
import os
import re

import numpy as np

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_readme_example_runs():
    code = re.search(r"```python\n(.*?)```", open(README).read(), re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert np.isfinite(scope["loss"])
    assert scope["ex"].pool.high_water == scope["ex"].planned["peak_bytes"] <= 64 << 20
