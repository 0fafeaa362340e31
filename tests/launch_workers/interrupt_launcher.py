"""Helper for tests/core/test_launch.py: a stand-in notebook kernel that launches sleep_worker.py.

    python interrupt_launcher.py PID_DIR

The test sends this process SIGINT (what Jupyter's interrupt button does) once the workers have
written their pids; torchrun() must stop every worker and re-raise KeyboardInterrupt.
"""
import sys
from pathlib import Path

from mnist_helpers.launch import torchrun

if __name__ == "__main__":
    worker = Path(__file__).with_name("sleep_worker.py")
    torchrun(str(worker), ["--pid-dir", sys.argv[1]], nproc=2, timeout=120, provision=False)
