"""Notebook 07 (07_scaling_and_multinode.ipynb): its ``lesson`` module and the code its scripts share."""
