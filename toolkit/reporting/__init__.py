"""What a person looks at after a run: terminal tables (colour on a terminal, plain when piped), progress lines
on stderr, and a self-contained HTML page with plots (``edgetk report --html``).

``terminal`` and ``progress`` are stdlib-only; ``plots`` and ``html`` load matplotlib (the ``report`` extra)
when called.
"""
