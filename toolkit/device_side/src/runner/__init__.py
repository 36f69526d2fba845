"""The on-device runner's blocks: toolkit.device_side assembles them, in the order src/edgetk_runner.py
names them, into the one shipped file. Never imported on the device; the host type-checks them (src/mypy.ini)."""
