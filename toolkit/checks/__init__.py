"""Checking a deployed bundle on its device: the run, the gates (budget, correctness, placement, regression),
the device's own selection of the artifact to run, its eval set and the layer-by-layer divergence search.
"""
