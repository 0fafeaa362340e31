"""Notebook 09 (09_profiling_and_autotune.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
