"""Notebook 12 (12_ddp_in_depth.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
