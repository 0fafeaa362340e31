"""Notebook 04 (04_batch_size_and_lr.ipynb): its ``lesson`` module and the code its scripts share."""
