"""The lab's nbgrader course and its instructor commands (``python -m autograder --help``).

This folder is the nbgrader course root: ``nbgrader_config.py``, the master notebooks in
``source/lab/``, ``thresholds.toml``, and ``setup_cell.py`` (the first cell of every notebook).
``course.py`` holds the commands; nothing happens on import.
"""
