"""Builds the kiln Python package with CMake (python/CMakeLists.txt) for `pip install`.

The extension kiln._kiln, libkiln and the backend plugins are built by CMake and copied into
the package, where the extension finds libkiln by its $ORIGIN run path and load_backend finds
the plugins beside libkiln. KILN_BUILD_DIR=build/release reuses a configured build tree
(scripts/test.sh does, so the install is checked without building twice).
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class CMakeBuild(build_ext):
    def run(self):
        build_dir = os.environ.get("KILN_BUILD_DIR")
        if build_dir:
            build_dir = os.path.abspath(build_dir)
        else:
            build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
            subprocess.check_call([
                "cmake", "-S", os.path.dirname(os.path.abspath(__file__)), "-B", build_dir,
                "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DKILN_BUILD_TESTS=OFF",
                "-DKILN_BUILD_BENCH=OFF", "-DKILN_PYTHON=ON",
                f"-DPython_EXECUTABLE={sys.executable}"])
        targets = ["kiln_python_package", "kiln_sim"]
        if os.path.exists(os.path.join(build_dir, "libkiln_cuda.so")) or shutil.which("nvcc"):
            targets.append("kiln_cuda")
        subprocess.check_call(["cmake", "--build", build_dir, "--target", *targets])
        out = os.path.join(self.build_lib, "kiln")
        os.makedirs(out, exist_ok=True)
        files = glob.glob(os.path.join(build_dir, "python", "kiln", "_kiln*.so"))
        files += [os.path.join(build_dir, "python", "kiln", "__init__.pyi")]
        files += [p for p in glob.glob(os.path.join(build_dir, "libkiln_*.so"))]
        for path in files:
            shutil.copy2(path, out)
        # The extension needs libkiln.so.0 (its soname): copy the file, not the link.
        shutil.copy2(os.path.realpath(os.path.join(build_dir, "libkiln.so.0")),
                     os.path.join(out, "libkiln.so.0"))


setup(
    packages=["kiln"],
    package_dir={"kiln": "python/kiln"},
    ext_modules=[Extension("kiln._kiln", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
