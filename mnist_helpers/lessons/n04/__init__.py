"""Notebook 04 (04_batch_size_and_lr.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
