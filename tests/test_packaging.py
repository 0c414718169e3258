"""The distribution installs one import name; plugins are discovered without importing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from schedlab import registry


def _run(code: str) -> subprocess.CompletedProcess:
    # run outside the repository so the checkout's folders are not on sys.path
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")


def test_public_api_imports():
    r = _run("from schedlab import LLM, SamplingParams\n"
             "print(LLM.__name__, SamplingParams().max_tokens)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["LLM", "16"]


def test_no_top_level_folder_modules():
    code = (
        "import importlib.util as u\n"
        "print([m for m in ('framework', 'plugins') if u.find_spec(m)])\n"
        "import schedlab.kernels, schedlab.plugins\n"
        "print(schedlab.kernels.__name__, schedlab.plugins.__name__)\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "[]"
    assert lines[1] == "schedlab.kernels schedlab.plugins"


def test_kernels_name_is_not_ours_at_top_level():
    # Hugging Face's `kernels` package, which transformers probes for, must not find our folder
    r = _run("import importlib.util as u, schedlab; s = u.find_spec('kernels');"
             "print(s is None or 'schedlab' not in (s.origin or ''))")
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def test_the_checkouts_kernels_folder_hands_the_top_level_name_over(tmp_path):
    """With the checkout's root on sys.path (`python -m pytest`, `python -c` in the
    repository), `import kernels` is Hugging Face's package where one is installed
    (transformers >= 5.25 imports it), not our folder; `schedlab.kernels` is ours."""
    root = Path(__file__).resolve().parents[1]
    hub = tmp_path / "site" / "kernels"  # stands for the installed package
    hub.mkdir(parents=True)
    (hub / "__init__.py").write_text("class CUDAProperties:\n    pass\n")
    code = ("import sys\nsys.path[:0] = sys.argv[1:]\nfrom kernels import CUDAProperties\n"
            "import kernels\nprint(kernels.__file__)\n"
            "import schedlab.kernels\nprint(schedlab.kernels.__file__)\n")
    r = subprocess.run([sys.executable, "-c", code, str(root), str(hub.parent)],
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [str(hub / "__init__.py"),
                                     str(root / "kernels" / "__init__.py")]


def test_discovery_does_not_import_plugins():
    code = (
        "import sys\n"
        "from schedlab import registry\n"
        "names = {k: registry.available(k) for k in registry.GROUPS}\n"
        "print(sorted(m for m in sys.modules if m.startswith('schedlab.plugins.')))\n"
        "print(names['scheduler'])\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    loaded, scheds = r.stdout.splitlines()
    assert loaded == "[]"
    assert "continuous" in scheds and "static" in scheds


def test_builtins_are_entry_points():
    for kind, names in {
        "scheduler": ["static", "continuous"],
        "queue": ["fcfs"],
        "kv_allocator": ["paged", "contiguous"],
        "prefix_cache": ["none"],
        "attention": ["sdpa"],
        "executor": ["torch"],
    }.items():
        assert set(names) <= set(registry.available(kind))
        for n in names:
            assert registry.load(kind, n).__module__.startswith("schedlab.plugins.")


def test_every_code_and_config_folder_is_a_listed_package():
    """A folder missing from pyproject's `packages` is silently left out of a wheel (and made
    setuptools print screens of warnings): every folder holding .py or .yaml files is listed."""
    from pathlib import Path

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    root = Path(__file__).resolve().parents[1]
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    missing = []
    for name, folder in setup["package-dir"].items():
        base = root / folder
        for d in [base, *base.rglob("*")]:
            if d.is_dir() and "__pycache__" not in d.parts and (
                    any(d.glob("*.py")) or any(d.glob("*.yaml"))):
                pkg = ".".join([name, *d.relative_to(base).parts])
                if pkg not in listed:
                    missing.append(pkg)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
