"""Shared fixtures live in tests/fixtures/ as plugins, one module per kind of expensive thing
(trained models, SSH devices, device environments), so that each is built once per run."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("EDGETK_TEST", "1")

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.torch_models",
    "tests.fixtures.cli",
    "tests.fixtures.home",
    "tests.fixtures.device_envs",
    "tests.fixtures.bundles",
    "tests.fixtures.optimization_models",
    "tests.fixtures.tflite",
    "tests.fixtures.ppocr",
    "tests.fixtures.silero",
    "tests.fixtures.real_models",
    "tests.fixtures.role_models",
    "tests.fixtures.pte",
    "tests.fixtures.sshd",
    "tests.fixtures.dropbear",
    "tests.fixtures.deploy",
    "tests.fixtures.arm",
    "tests.fixtures.arm_executorch",
    "tests.fixtures.runs",
    "tests.fixtures.netns",
    "tests.fixtures.postgres",
    "tests.fixtures.workers",  # xdist: a module per worker, longest first, cached models built once
    "tests.fixtures.timing_log",  # EDGETK_TEST_TIMES=DIR: every phase and fixture set-up timed (scripts/test-times)
    "tests.fixtures.require",  # EDGETK_REQUIRE=ssh,netns,arm: such a test skipped is a failure (CI sets it)
]
