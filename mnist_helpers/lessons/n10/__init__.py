"""Notebook 10 (10_speedrun.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
