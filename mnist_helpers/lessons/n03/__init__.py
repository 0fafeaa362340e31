"""Notebook 03 (03_dataloader_tuning.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
