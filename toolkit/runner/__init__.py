"""The on-device runner. ``edgetk_runner.py`` is ONE self-contained file (Python >= 3.6, stdlib + numpy + one
runtime) that is copied into every bundle and run on the device; nothing in the toolkit imports it."""
