"""``bench/gpu.py probe``: one GPU measurement in a process of its own (``probe.py``)."""
