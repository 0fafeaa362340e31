"""Notebook 01 (01_resource_inspection.ipynb): its lesson module (``lesson``) and the measurement code its scripts share."""
