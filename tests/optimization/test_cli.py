"""``edgetk optimize`` through the real CLI: the JSON report, and plain exit-2 messages for bad input."""

from __future__ import annotations

import pytest

from tests.fixtures.cli import assert_clean_error


def test_cli_json_report(edgetk, digits_keras, digits_keras_train, digits_eval, tmp_path):
    out = tmp_path / "pruned.keras"
    result = edgetk("optimize", digits_keras, "--prune", "0.5", "--train-data", digits_keras_train,
                    "--eval-data", digits_eval, "--epochs", "1", "--out", out, "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    assert doc["output_format"] == "keras" and out.is_file()
    assert doc["steps"][0]["technique"] == "prune"
    assert doc["steps"][0]["details"]["sparsity"] >= 0.5
    assert doc["final"]["nonzero_params"] < doc["baseline"]["nonzero_params"] * 0.6
    for key in ("params", "nonzero_params", "file_bytes", "gzip_bytes", "latency_ms", "accuracy"):
        assert doc["baseline"][key] is not None


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--prune", "1.5"], ["sparsity", "between 0 and 1"]),
        (["--prune", "0"], ["sparsity"]),
        (["--cluster", "1"], ["at least 2 clusters"]),
        (["--low-rank", "1.5"], ["energy", "(0, 1]"]),
        (["--rank", "1000"], ["rank 1000 is larger"]),
        (["--qat"], ["needs training data"]),
    ],
)
def test_cli_bad_input(edgetk, digits_keras, tmp_path, args, needles):
    out = tmp_path / "x.keras"
    result = edgetk("optimize", digits_keras, *args, "--out", out)
    assert_clean_error(result, 2, *needles)
    assert not out.exists()


def test_cli_unknown_source(edgetk, tmp_path):
    assert_clean_error(edgetk("optimize", tmp_path / "nope.keras", "--prune", "0.5", "--out", tmp_path / "o.keras"),
                       2, "does not exist")


def test_cli_student_teacher_mismatch(edgetk, digits_torch, tmp_path):
    student = digits_torch.factory.replace(":make_model", ":make_wrong_student")
    result = edgetk("optimize", student, "--distill-from", digits_torch.torchscript, "--train-data",
                    digits_torch.train, "--epochs", "1", "--out", tmp_path / "s.pt")
    assert_clean_error(result, 2, "output shape", "does not match")
