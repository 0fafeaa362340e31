"""Notebook 06 (06_ddp_fundamentals.ipynb): its ``lesson`` module and the code its scripts share."""
