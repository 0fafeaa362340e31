"""Notebook 00 (00_setup_and_data.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
