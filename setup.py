"""Only here to ship tilesmith_runtime_autoload.pth into site-packages (everything else: pyproject.toml).

The .pth line imports tilesmith.runtime at interpreter start-up when TILESMITH_RUNTIME is set (and
not "0"), for programs one cannot edit; unset, it costs one environment lookup.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_SOURCE = os.path.join("tilesmith", "runtime", "autoload.pth")
PTH_NAME = "tilesmith_runtime_autoload.pth"


class build_py_with_pth(build_py):
    """Copy the .pth to the root of the build (the wheel's purelib root = site-packages)."""

    def run(self):
        super().run()
        self.copy_file(PTH_SOURCE, os.path.join(self.build_lib, PTH_NAME), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH_NAME)]

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        mapping[os.path.join(self.build_lib, PTH_NAME)] = PTH_SOURCE
        return mapping


def _pth_bytes() -> bytes:
    with open(PTH_SOURCE, "rb") as f:
        return f.read()


cmdclass = {"build_py": build_py_with_pth}
try:
    # Editable installs (`pip install -e .`) ship only a finder, not build_py's extra files: add the
    # .pth to the editable wheel through setuptools' strategy hook (private API; verified on
    # setuptools 84; on a setuptools without it, an editable install simply lacks the autoload).
    from setuptools.command.editable_wheel import editable_wheel

    class editable_wheel_with_pth(editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            inner = super()._select_strategy(*args, **kwargs)

            class _WithPth:
                def __enter__(self):
                    inner.__enter__()
                    return self

                def __exit__(self, *exc):
                    return inner.__exit__(*exc)

                def __call__(self, wheel, files, mapping):
                    inner(wheel, files, mapping)
                    wheel.writestr(PTH_NAME, _pth_bytes())

            return _WithPth()

    if hasattr(editable_wheel, "_select_strategy"):
        cmdclass["editable_wheel"] = editable_wheel_with_pth
except ImportError:
    pass

setup(cmdclass=cmdclass)
