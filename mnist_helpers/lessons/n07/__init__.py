"""Notebook 07 (07_scaling_and_multinode.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
