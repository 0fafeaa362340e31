"""Notebook 11 (11_beyond_data_parallel.ipynb): its ``lesson`` module and the code its scripts share."""
