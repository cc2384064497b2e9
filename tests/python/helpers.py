"""Shared by the Python package's tests: where things are, and running ranks the way users do."""
import os
import shutil
import subprocess
import tempfile
import time
import unittest

ROOT = os.environ.get("POSEIDON_SOURCE", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
CLI = os.environ.get("POSEIDON_CLI", os.path.join(ROOT, "build", "bin", "poseidon"))
PYTHONPATH = os.environ.get("POSEIDON_PYTHONPATH", os.path.join(ROOT, "build", "python"))
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch; the python3 first on PATH may have no torch
JOBS = os.path.join(ROOT, "tests", "python", "jobs")
# Launcher variables inherited from whatever runs the tests (Slurm, mpirun) must not reach a lone rank.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")


def env():
    e = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    e["PYTHONPATH"] = PYTHONPATH
    return e


class Run:
    def __init__(self, args, timeout=600, cwd=None):
        start = time.time()
        p = subprocess.run(args, env=env(), cwd=cwd, capture_output=True, text=True, timeout=timeout)
        self.seconds = time.time() - start
        self.code, self.out, self.err = p.returncode, p.stdout, p.stderr

    def __str__(self):
        return "exit %d after %.1f s\n--- stdout\n%s--- stderr\n%s" % (self.code, self.seconds, self.out, self.err)


def launch(ranks, script, *args, timeout=600, cwd=None):
    return Run([CLI, "launch", "-n", str(ranks), "--", PYTHON, script] + [str(a) for a in args], timeout, cwd)


def alone(script, *args, timeout=600, cwd=None):
    return Run([PYTHON, script] + [str(a) for a in args], timeout, cwd)


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="poseidon-py-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def script(self, name, text):
        """A program the test runs, written into the test's directory; its path."""
        path = self.path(name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def assertClean(self, run):
        """No crash at exit: no C++ terminate, no abort, no fatal Python error."""
        for bad in ("terminate called", "core dumped", "Fatal Python error", "Segmentation fault", "SIGABRT"):
            self.assertNotIn(bad, run.err, str(run))
