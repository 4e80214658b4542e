"""``bench/capacity.py``'s parts, one module per purpose.

  sizes    the GPT shapes a search walks (a size is its number of layers) and their bytes:
           training state, page store, checkpoint, the disk's cap
  probe    one probe: a ``jaxoff train`` run in a child process with a memory watchdog
           (``_common/child.py``), and the verdict on it
  search   the bracketing search on layers, over any probe function
  summary  the table of probes and the summary a result holds

Imported with ``bench/`` on ``sys.path`` (``bench/capacity.py`` puts it there), as are
``_common`` and each other.
"""
