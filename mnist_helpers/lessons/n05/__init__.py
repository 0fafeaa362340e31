"""Notebook 05 (05_mixed_precision_and_memory.ipynb): its ``lesson`` module and the code its scripts share."""
