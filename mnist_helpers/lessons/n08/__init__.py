"""Notebook 08 (08_troubleshooting.ipynb): its ``lesson`` module and the code its scripts share."""
