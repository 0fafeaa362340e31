"""Notebook 00 (00_setup_and_data.ipynb): its ``lesson`` module and the code its scripts share."""
