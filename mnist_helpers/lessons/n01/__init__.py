"""Notebook 01 (01_resource_inspection.ipynb): its ``lesson`` module and the code its scripts share."""
