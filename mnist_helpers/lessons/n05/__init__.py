"""Notebook 05 (05_mixed_precision_and_memory.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
