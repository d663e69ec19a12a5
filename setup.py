"""`pip install .`: builds burstlab._core (and, with BURSTLAB_CUDA=ON, burstlab._cuda) with the
project's CMake and puts them next to the package's Python files (python/burstlab).

Environment: BURSTLAB_CUDA=ON builds the cuda layer and the operator's CUDA kernels (minutes of
nvcc; off by default, so the wheel imports anywhere); BURSTLAB_NATIVE=ON compiles for this CPU
(-march=native: faster oracle, a wheel for this machine only); BURSTLAB_CMAKE_ARGS adds arguments.
The CMake build directory is build/pip-<interpreter>, kept between installs.
"""
import hashlib
import os
import shlex
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        package_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))  # .../burstlab
        tag = hashlib.sha1(sys.executable.encode()).hexdigest()[:8]
        build = os.path.join(ROOT, "build", f"pip-{sys.implementation.cache_tag}-{tag}")
        on_off = lambda name: "ON" if os.environ.get(name, "OFF").upper() in ("1", "ON", "TRUE", "YES") else "OFF"
        args = [f"-DBURSTLAB_PYTHON_OUTPUT_DIR={os.path.dirname(package_dir)}", f"-DPython3_EXECUTABLE={sys.executable}",
                "-DCMAKE_BUILD_TYPE=Release", "-DBURSTLAB_PYTHON=ON", "-DBURSTLAB_TESTS=OFF", "-DBURSTLAB_INSTALL=OFF",
                f"-DBURSTLAB_CUDA={on_off('BURSTLAB_CUDA')}", f"-DBURSTLAB_NATIVE={on_off('BURSTLAB_NATIVE')}"]
        try:
            import pybind11

            args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:  # CMake looks for Debian's pybind11-dev
            pass
        args += shlex.split(os.environ.get("BURSTLAB_CMAKE_ARGS", ""))
        subprocess.run(["cmake", "-S", ROOT, "-B", build, *args], check=True)
        subprocess.run(["cmake", "--build", build, "--target", "burstlab_python", "-j", str(os.cpu_count() or 2)],
                       check=True)
        built = [f for f in os.listdir(package_dir) if f.startswith("_core.")]
        if not built:
            raise RuntimeError(f"the CMake build put no _core module into {package_dir}")


setup(ext_modules=[Extension("burstlab._core", sources=[])], cmdclass={"build_ext": CMakeBuild})
