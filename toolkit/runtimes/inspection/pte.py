"""What is inside an ExecuTorch program (``.pte``): its ``forward`` inputs and outputs, the operators and
delegates of its plan, and how many tensors PT2E quantized (the constant method the route writes: the XNNPACK
payload hides its ops). A .pte carries no tensor names; its tensors are ``input_<i>`` / ``output_<i>``, matched to
the source's by position."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any  # Any: ExecuTorch's program, method and schema objects (untyped)

from toolkit.errors import MissingDependency, UsageError, key_line
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import Format, Precision
from toolkit.runtimes.inspection import ModelInfo

# ExecuTorch ScalarType codes -> numpy dtype names (the ones a model's I/O can have)
SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                7: "float64", 11: "bool"}
# A constant method in every .pte the route writes (conversion.torch_pte): how many tensors PT2E quantized (the
# delegate's payload hides its ops, so this is read to prove an int8 label, as quantized ops are counted in TFLite
# and ONNX files).
QUANTIZED_METHOD = "edgetk_quantized_tensors"
# ... and how many weights are float16 (an fp16 artifact: a half model behind float32 I/O)
HALF_METHOD = "edgetk_half_tensors"


def import_executorch(purpose: str) -> ModuleType:
    """The ``executorch`` package, or MissingDependency naming the extra."""
    try:
        import executorch
    except ImportError as exc:
        raise MissingDependency("executorch", extra="executorch", purpose=purpose) from exc
    return executorch


def tensor_specs(meta: Any, what: str) -> tuple[TensorSpec, ...]:
    """``forward``'s inputs (``what="input"``) or outputs from its MethodMeta (ExecuTorch's: Any), named by
    position."""
    count = meta.num_inputs() if what == "input" else meta.num_outputs()
    specs = []
    for i in range(count):
        info = meta.input_tensor_meta(i) if what == "input" else meta.output_tensor_meta(i)
        specs.append(TensorSpec(f"{what}_{i}", tuple(int(d) for d in info.sizes()),
                                SCALAR_TYPES.get(int(info.dtype()), "float32")))
    return tuple(specs)


def load_program(path: Path) -> Any:
    """``path`` loaded by ExecuTorch's Python runtime, as its Program (Any: ExecuTorch's object); UsageError when
    it is no program it can load."""
    import_executorch("Reading a .pte artifact")
    from executorch.runtime import Runtime

    try:
        return Runtime.get().load_program(Path(path))
    except Exception as exc:
        raise UsageError(f"ExecuTorch cannot load {Path(path).name}: {key_line(exc)}",
                         hint="Rebuild the artifact with `edgetk convert --format pte`.") from exc


def inspect_pte(path: Path) -> ModelInfo:
    from toolkit.compat.executorch import pte_program

    program = load_program(path)
    meta = program.metadata("forward")
    quantized, half = (_constant(program, name) for name in (QUANTIZED_METHOD, HALF_METHOD))
    plan = next(p for p in _plans(pte_program(Path(path).read_bytes())) if p.name == "forward")
    counts: Counter[str] = Counter(f"delegate:{d.id}" for d in plan.delegates)
    counts.update(op.name for op in plan.operators)
    portable = sum(1 for op in plan.operators)
    return ModelInfo(
        path=str(path), format=Format.PTE, bytes=Path(path).stat().st_size, inputs=tensor_specs(meta, "input"),
        outputs=tensor_specs(meta, "output"), op_counts=dict(counts), quantized_ops=quantized,
        float_compute_ops=portable,
        precision=Precision.INT8 if quantized else Precision.FP16 if half else Precision.FP32,
        extra={"delegates": [d.id for d in plan.delegates], "methods": sorted(program.method_names)},
    )


def _constant(program: Any, name: str) -> int:
    """The integer a constant method the route wrote returns (0 when the program has none: another exporter's)."""
    if name not in program.method_names:
        return 0
    method = program.load_method(name)
    return int(method.execute([])[0]) if method is not None else 0


def _plans(serialized: Any) -> list[Any]:
    """The execution plans of a deserialized program (ExecuTorch's schema objects: Any)."""
    program = getattr(serialized, "program", serialized)  # 1.x wraps the Program with its segments
    return list(program.execution_plan)
