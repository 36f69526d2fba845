"""Tests of the on-device runner, run with device-side pythons."""
