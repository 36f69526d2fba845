"""Verification of an artifact against the float model: metrics per output, per slice and per task.

The modules, each with one job (numpy is imported only by the ones that compute):

* :mod:`.tolerance`: the one :class:`Tolerance` type (profiles, the convert stage and the device check).
* :mod:`.records`: the frozen records written to the manifest (per-output, per-slice, the golden slice checks).
* :mod:`.tasks`: the task vocabulary and its inference from the float outputs.
* :mod:`.slices`: per-output error and the channel-by-channel split of tensors that mix ranges.
* :mod:`.detection`, :mod:`.segmentation`, :mod:`.dense`: the task metrics.
* :mod:`.user_metric`: ``--metric file.py:fn``.
* :mod:`.outputs`: :func:`verify_outputs`, the one call the convert stage makes per candidate.
* :mod:`.batching`: a dynamic-batch artifact's outputs per sample at batch 4 and 8 against batch 1.

This package file imports nothing, so that ``toolkit.model`` and ``edgetk --help`` can reach the records and
the tolerance for free.
"""
