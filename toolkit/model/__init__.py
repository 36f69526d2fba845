"""The records that flow between the stages, and the vocabulary they are written in.

Frozen dataclasses and enums (precision, format, framework, runtime, status, task, role), the check policy and
tolerances, the target profiles and the schemas of the files users write (one engine reads them all:
:mod:`~toolkit.model.reading`), each defined once. This package sits under every stage: it imports nothing
of the toolkit but :mod:`toolkit.errors`, the standard library's, and :mod:`toolkit.device_side`'s probe
names; a stage never validates by importing another stage.
"""
