"""The planner's benches, one module per subcommand of ``bench/plan.py``.

Imported with ``bench/`` on ``sys.path`` (``bench/plan.py`` runs from there), as are
``_common`` and each other.
"""
