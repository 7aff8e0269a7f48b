"""TILESMITH_RUNTIME=1: a .pth shipped by the package imports tilesmith.runtime at start-up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PTH = ROOT / "tilesmith" / "runtime" / "autoload.pth"


@pytest.mark.parametrize("value,loaded", [("1", True), ("", False), ("0", False), (None, False)])
def test_the_autoload_pth_imports_the_runtime_only_when_tilesmith_runtime_is_set(tmp_path, value, loaded):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    shutil.copy(PTH, site_dir / "tilesmith_runtime_autoload.pth")
    env = {k: v for k, v in os.environ.items() if k != "TILESMITH_RUNTIME"}
    if value is not None:
        env["TILESMITH_RUNTIME"] = value
    code = (f"import site, sys; site.addsitedir({str(site_dir)!r}); "
            "print('tilesmith.runtime' in sys.modules, any(m.startswith('torch') for m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.split() == [str(loaded), "False"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "editable"])
def test_both_a_wheel_and_an_editable_install_ship_the_pth_at_the_site_packages_root(tmp_path, kind):
    # Build from a copy of the sources, so no build folder lands in the checkout.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "tests", "build", "dist", "*.egg-info",
                                                             "__pycache__", "tilesmith-workspace"))
    out = tmp_path / "dist"
    out.mkdir()
    fn = "build_wheel" if kind == "wheel" else "build_editable"
    code = f"import setuptools.build_meta as b; print(b.{fn}({str(out)!r}))"
    p = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    names = zipfile.ZipFile(out / p.stdout.strip().splitlines()[-1]).namelist()
    assert "tilesmith_runtime_autoload.pth" in names
