"""The device helper's blocks: toolkit.device_side assembles them, in the order src/device_helper.py names
them, into the one shipped file. Never imported on the device; the host type-checks them (src/mypy.ini)."""
