"""Notebook 02 (02_single_device_baseline.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
