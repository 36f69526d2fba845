"""Verification of an artifact against the float model: metrics per output, per slice and per task.

The modules, each with one job (numpy is imported only by the ones that compute):

* :mod:`.outputs`: :func:`verify_outputs`, the one call the convert stage makes per candidate, and its verdict.
* :mod:`.inference`: each output's role and the model's task, inferred from the float outputs.
* :mod:`.slices`: per-output error and the channel-by-channel split of tensors that mix ranges.
* :mod:`.role_metrics`, :mod:`.task_metrics`: the metrics of an output's role and of the model's task
  (:mod:`.dense`, :mod:`.detection`, :mod:`.segmentation`, :mod:`.sequence`).
* :mod:`.user_metric`: ``--metric file.py:fn``.
* :mod:`.verify`: what the stages call (compare, timing on this host, the golden slices).

The records and the tolerance they are judged by live in :mod:`toolkit.model`. This package file imports
nothing, so that ``edgetk --help`` can reach a module of it for free.
"""
