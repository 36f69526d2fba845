"""The route table: every (framework, format) route has a conversion test, every refusal is plain.

``ROUTE_TESTS`` names, for each built route of ``routes.ROUTES``, the test that converts a model through it.
Adding a route without naming its test fails here; naming a test that does not exist fails too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from toolkit.conversion import routes
from toolkit.errors import UsageError

TESTS = Path(__file__).resolve().parents[1]

ROUTE_TESTS: dict[tuple[str, str], str] = {
    ("keras", "tflite"): "conversion/test_tflite.py::test_int8_accuracy_within_one_point_of_float",
    ("savedmodel", "tflite"): "conversion/test_tflite.py::test_sequential_and_savedmodel_sources",
    ("torch_factory", "tflite"): "conversion/test_torch_tflite.py::test_conv_net_fp32_matches_eager",
    ("exported_program", "tflite"): "conversion/test_torch_tflite.py::test_exported_program_to_tflite",
    ("torch_factory", "pte"): "executorch/test_pte_convert.py::test_digits_pte_verified_against_eager_and_labels",
    ("exported_program", "pte"): "executorch/test_pte_convert.py::test_exported_program_to_pte_int8",
    ("tflite", "tflite"): "test_pipeline.py::test_tflite_source_is_taken_as_it_is",
    ("tflite", "onnx"): "verification/test_shipped_models.py::"
                        "test_blazeface_onnx_from_tflite_fp32_matches_and_int8_is_refused",
    ("keras", "onnx"): "conversion/test_tf_onnx.py::test_sequential_model_exports_and_matches_keras",
    ("savedmodel", "onnx"): "conversion/test_tf_onnx.py::test_savedmodel_source_exports",
    ("torch_factory", "onnx"): "conversion/test_torch_onnx.py::test_conv_net_fp32_is_exact_single_file_opset_18",
    ("exported_program", "onnx"): "conversion/test_torch_onnx.py::test_exported_program_to_onnx",
    ("torchscript", "onnx"): "conversion/test_torch_onnx.py::test_torchscript_goes_through_the_legacy_exporter_named",
    ("onnx", "onnx"): "conversion/test_onnx_quant.py::test_ppocr_int8_loads_runs_and_detects_text",
}


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_route_has_a_conversion_test() -> None:
    built = {pair for pair, row in routes.ROUTES.items() if row.backend}
    assert set(ROUTE_TESTS) == built, "name the conversion test of each route in ROUTE_TESTS"
    for route, test in ROUTE_TESTS.items():
        file, _, name = test.partition("::")
        assert name in _test_functions(TESTS / file), f"{route}: {test} does not exist"


def test_every_route_resolves_to_a_backend_of_its_format() -> None:
    from toolkit.conversion.backend import Backend, backend_for

    for (framework, fmt), row in routes.ROUTES.items():
        if row.backend is None:
            continue
        backend = backend_for(framework, fmt)
        assert isinstance(backend, Backend) and backend.format == fmt, row.backend
        if fmt == "onnx":  # every ONNX precision derives from the source's float export
            assert type(backend).float_export is not Backend.float_export, f"{row.backend} has no float export"


@pytest.mark.parametrize(("framework", "fmt"), sorted(pair for pair, row in routes.ROUTES.items() if row.refusal))
def test_refused_pairs_say_what_to_use(framework: str, fmt: str) -> None:
    assert routes.ROUTES[framework, fmt].backend is None
    with pytest.raises(UsageError) as caught:
        routes.check_supported(framework, fmt)
    assert caught.value.hint and "--format" in caught.value.hint


def test_a_pair_in_neither_table_has_no_route() -> None:
    refusal = routes.supports("keras", "coreml")
    assert refusal is not None and "no route from keras to coreml" in refusal.message
    assert not routes.supports_precision("torch_factory", "tflite", "dynamic")
    assert routes.supports_precision("keras", "tflite", "dynamic")
