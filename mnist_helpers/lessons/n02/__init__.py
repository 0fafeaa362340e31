"""Notebook 02 (02_single_device_baseline.ipynb): its ``lesson`` module and the code its scripts share."""
