"""The design card's layout: model definitions in the top-level models/ folder, importable as
neuron.models from a source checkout, an editable install and a regular install (wheel)."""
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = ("import neuron, neuron.models as m; from neuron.models import build_model; "
         "g = build_model('resnet_cifar', depth=8); print(m.__file__); print(len(g.route))")


def test_the_card_names_these_top_level_entries():
    for entry in ("setup.py", "README.md", "neuron", "models", "tests", "bench",
                  "neuron/kernels", "neuron/memory", "neuron/layers"):
        assert os.path.exists(os.path.join(ROOT, entry)), entry
    assert not os.path.exists(os.path.join(ROOT, "neuron", "models", "__init__.py"))


def test_source_checkout_maps_neuron_models_to_models():
    import neuron.models
    assert os.path.dirname(neuron.models.__file__) == os.path.join(ROOT, "models")


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """The tracked files only (no build products), so installs start clean."""
    dst = tmp_path_factory.mktemp("src") / "neuron-src"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        os.makedirs(dst / os.path.dirname(f), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), dst / f)
    return dst


def _probe(python, cwd, env=None):
    out = subprocess.run([python, "-c", PROBE], cwd=cwd, capture_output=True, text=True,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


@pytest.mark.slow
def test_regular_install_ships_models_inside_the_package(source_copy, tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels), str(source_copy)], check=True)
    (whl,) = wheels.glob("neuron_arena-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "neuron/models/__init__.py" in names and "neuron/models/resnet.py" in names
    assert not any(n.startswith("models/") for n in names)
    target = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(target)
    env = dict(os.environ, PYTHONPATH=str(target))
    path, layers = _probe(sys.executable, tmp_path, env)
    assert path == str(target / "neuron" / "models" / "__init__.py") and int(layers) > 10


@pytest.mark.slow
def test_editable_install_uses_the_checkout(source_copy, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "-e", str(source_copy)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    path, layers = _probe(py, tmp_path, env)
    assert path == str(source_copy / "models" / "__init__.py") and int(layers) > 10
    # the console script of [project.scripts] reaches the command line's entry
    out = subprocess.run([str(venv / "bin" / "neuron"), "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: neuron"), out.stderr[-2000:]


def test_the_distribution_has_a_name_of_its_own_and_every_install_hint_uses_it():
    """PyPI's `neuron` is another project (the NEURON simulator): an install hint naming it
    with an extra would install that. The distribution is neuron-arena; the import stays `neuron`."""
    import re
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert re.search(r'^name = "neuron-arena"$', f.read(), re.M)
    # the bare name with an extra, quoted or after pip install (not a variable indexed)
    wrong = re.compile(r"(['\"]|pip install\s+)" + "neuron" + r"\[")
    found = []
    for top in ("neuron", "models", "bench", "tests", ".ci"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".py", ".sh", ".toml", ".cfg")) or name == "run":
                    path = os.path.join(dirpath, name)
                    with open(path, errors="replace") as f:
                        for i, line in enumerate(f, 1):
                            if wrong.search(line):
                                found.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
