"""Notebook 11 (11_beyond_data_parallel.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
