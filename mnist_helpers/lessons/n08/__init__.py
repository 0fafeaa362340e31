"""Notebook 08 (08_troubleshooting.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
