"""``edgetk optimize`` through the real CLI: the JSON report, and plain exit-2 messages for bad input."""

from __future__ import annotations

import pytest

from tests.fixtures.cli import assert_clean_error


def test_cli_json_report(keras_pruned_cli):  # type: ignore[no-untyped-def]
    run = keras_pruned_cli  # edgetk optimize DIGITS --prune 0.6 --epochs 1 --json (tests/optimization/conftest.py)
    assert run.code == 0, run.stderr
    doc = run.doc
    assert doc["output_format"] == "keras" and run.out.is_file() and doc["output"] == str(run.out)
    assert doc["steps"][0]["technique"] == "prune" and doc["steps"][0]["fine_tuned"] is True
    assert doc["steps"][0]["details"]["sparsity"] >= 0.6
    assert doc["final"]["nonzero_params"] < doc["baseline"]["nonzero_params"] * 0.45
    for key in ("params", "nonzero_params", "file_bytes", "gzip_bytes", "latency_ms", "accuracy"):
        assert doc["baseline"][key] is not None
    assert doc["change"]["gzip_ratio"] < 1.0


BAD = [
    (["--prune", "1.5"], ["sparsity", "between 0 and 1"]),
    (["--prune", "0"], ["sparsity"]),
    (["--cluster", "1"], ["at least 2 clusters"]),
    (["--low-rank", "1.5"], ["energy", "(0, 1]"]),
    (["--rank", "1000"], ["rank 1000 is larger"]),
    (["--qat"], ["needs training data"]),
]


# each case in this process (Keras loaded once); `--rank 1000`, which loads the model, also as a real process
@pytest.mark.parametrize(
    "args, needles, in_process",
    [(a, n, True) for a, n in BAD] + [(["--rank", "1000"], ["rank 1000 is larger"], False)],
    ids=[" ".join(a) for a, _ in BAD] + ["--rank 1000 (process)"],
)
def test_cli_bad_input(edgetk, edgetk_inproc, digits_keras, tmp_path, args, needles, in_process):
    out = tmp_path / "x.keras"
    result = (edgetk_inproc if in_process else edgetk)("optimize", digits_keras, *args, "--out", out)
    assert_clean_error(result, 2, *needles)
    assert not out.exists()


def test_cli_unknown_source(edgetk_inproc, tmp_path):
    assert_clean_error(edgetk_inproc("optimize", tmp_path / "nope.keras", "--prune", "0.5", "--out",
                                     tmp_path / "o.keras"), 2, "does not exist")


def test_cli_student_teacher_mismatch(edgetk_inproc, digits_torch, tmp_path):
    student = digits_torch.factory.replace(":make_model", ":make_wrong_student")
    result = edgetk_inproc("optimize", student, "--distill-from", digits_torch.torchscript, "--train-data",
                           digits_torch.train, "--epochs", "1", "--out", tmp_path / "s.pt")
    assert_clean_error(result, 2, "output shape", "does not match")
