"""Notebook 12 (12_ddp_in_depth.ipynb): its ``lesson`` module and the code its scripts share."""
