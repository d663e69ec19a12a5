"""`pip install .`: builds burstlab._core (and, with BURSTLAB_CUDA=ON, burstlab._cuda) with the
project's CMake and puts them next to the package's Python files (python/burstlab).

Environment: BURSTLAB_CUDA=ON builds the cuda layer and the operator's CUDA kernels (minutes of
nvcc; off by default, so the wheel imports anywhere); BURSTLAB_NATIVE=ON compiles for this CPU
(-march=native: faster oracle, a wheel for this machine only); BURSTLAB_CMAKE_ARGS adds arguments;
BURSTLAB_PIP_PROGRESS=0 keeps the build's steps off the terminal (class Progress).
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


class Progress:
    """Where the user sees the build's steps. pip shows a build backend's output only with -vv
    (otherwise "still running..."), so each step also goes, as a plain line, to the terminal pip
    runs in when there is one, else to pip's own stderr. BURSTLAB_PIP_PROGRESS=0: stdout only."""

    def __init__(self):
        self.out, self.tty, self.lines = None, False, 0
        if os.environ.get("BURSTLAB_PIP_PROGRESS", "1") == "0" or sys.stdout.isatty():
            return  # stdout is seen already (setup.py run by hand)
        parent = f"/proc/{os.getppid()}"
        try:
            with open(f"{parent}/cmdline", "rb") as f:
                words = f.read().decode(errors="replace").split("\0")
        except OSError:
            words = []
        verbosity = sum(1 for w in words if w == "--verbose") + sum(
            len(w) - 1 for w in words if len(w) > 1 and w[0] == "-" and set(w[1:]) == {"v"})
        if verbosity >= 2:
            return  # pip -vv shows stdout (pip 23: -v does not)
        try:
            self.out, self.tty = open("/dev/tty", "w"), True
        except OSError:
            if any("pip" in w for w in words):
                try:
                    self.out = open(f"{parent}/fd/2", "w")
                except OSError:
                    pass

    def say(self, line):
        print(line, flush=True)
        if self.out is None:
            return
        # On a terminal pip's spinner shares the line: keep its first line, then wipe its marks.
        lead = ("\n" if self.lines == 0 else "\r\033[K") if self.tty else ""
        try:
            self.out.write(f"{lead}burstlab: {line}\n")
            self.out.flush()
            self.lines += 1
        except OSError:
            self.out = None


def run(cmd, progress, steps=False):
    """Runs cmd with its output on stdout, line by line; with steps, CMake's "[ n%] ..." lines
    also go to progress. Raises CalledProcessError on failure."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    for line in p.stdout:
        line = line.rstrip("\n")
        if steps and line.startswith("["):
            progress.say(line)
        else:
            print(line, flush=True)
    if p.wait() != 0:
        raise subprocess.CalledProcessError(p.returncode, cmd)


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
        progress = Progress()
        progress.say(f"configuring in {os.path.relpath(build, ROOT)} (the whole log: pip install -vv .)")
        run(["cmake", "-S", ROOT, "-B", build, *args], progress)
        progress.say("compiling the C++ module")
        run(["cmake", "--build", build, "--target", "burstlab_python", "-j", str(os.cpu_count() or 2)], progress,
            steps=True)
        progress.say("built")
        built = [f for f in os.listdir(package_dir) if f.startswith("_core.")]
        if not built:
            raise RuntimeError(f"the CMake build put no _core module into {package_dir}")


setup(ext_modules=[Extension("burstlab._core", sources=[])], cmdclass={"build_ext": CMakeBuild})
