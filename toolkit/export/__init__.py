"""Bundles packaged for other delivery systems than an SSH push (``edgetk export``): today Mender artifacts
for pull-based fleets (``mender``)."""
