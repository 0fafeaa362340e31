"""Notebook 10 (10_speedrun.ipynb): its ``lesson`` module and the code its scripts share."""
