"""Notebook 09 (09_profiling_and_autotune.ipynb): its ``lesson`` module and the code its scripts share."""
