"""Build script for the compiled parts of neuron.

Project metadata lives in pyproject.toml; setup.py only exists because the
pybind11 extensions have to be declared in code.
"""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup

ext_modules = [
    Pybind11Extension(
        "neuron.memory._heap",
        ["neuron/memory/_heap.cpp"],
        cxx_std=17,
        extra_compile_args=["-O2"],
    ),
]

setup(
    # the model definitions live in the top-level models/ folder (the design card's layout)
    # and install as neuron.models; neuron/_source_layout.py maps the name in a checkout
    packages=find_packages(include=["neuron", "neuron.*"]) + ["neuron.models"],
    package_dir={"neuron.models": "models"},
    # the DQN planner's default agent (bench/dqn.py trains it)
    package_data={"neuron.memory.planners": ["dqn_default.npz"]},
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_ext},
    zip_safe=False,
)
