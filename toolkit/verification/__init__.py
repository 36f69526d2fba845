"""Verification of an artifact against the float model: metrics per output, per slice and per task.

:mod:`.outputs` (:func:`verify_outputs`, the one call the convert stage makes per candidate) is the entry; the
records and the tolerance they are judged by live in :mod:`toolkit.model`. numpy is imported only by the modules
that compute; this package file imports nothing, so that ``edgetk --help`` can reach a module of it for free.
"""
