"""``torchrun ... -m mnist_helpers.workers.demos --demos sampler,seeding``: 12's demos behind one entry point."""
import sys

from mnist_helpers.workers.demos.common import cli

sys.exit(cli())
