"""Notebook 03 (03_dataloader_tuning.ipynb): its ``lesson`` module and the code its scripts share."""
