"""Notebook 06 (06_ddp_fundamentals.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
