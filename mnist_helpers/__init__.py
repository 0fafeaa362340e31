"""mnist-scale-lab's helper package: the single source every notebook imports and every DDP worker runs.

Four layers, each importing only its own layer or a lower one (tests/system/test_layout.py): the foundation (the modules
directly in this folder: data, models, train, distributed, launch, ...), ``course`` (the series machinery),
``lessons/nNN`` (one package per notebook) and ``workers``. docs/MAINTAINING.md, "The package", is the map.
"""

__version__ = "0.1.0"
