"""The bundled example that ``toolkit.quickstart`` (``edgetk quickstart``) runs; imports nothing from the API.

The bundled example is a small Keras CNN for the 8x8 handwritten digits that ship inside the package
(``calibration/digits/``). It is trained once at first use from ``train.npz`` (1,100 images, a few seconds on
two cores) and cached under ``$XDG_CACHE_HOME/edgetk/quickstart/`` (``~/.cache/...``), keyed by the training
data's hash and the Keras version, so later runs start converting at once. Then: the target profile that
matches this machine, convert with the shipped calibration/eval sets and labels, deploy to ``local``, check,
report.

The gates are real but cannot fail from timing noise: the latency budget is the profile's (20 ms for
generic-x86_64, hundreds of times what this model needs) and there is no regression baseline
(``--baseline none``): a first run has nothing to regress from, and a busy machine must not fail the demo.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any  # Any: a Keras model (Keras is untyped)

import numpy as np

from toolkit.errors import MissingDependency, UsageError

MODEL_FILE = "digits.keras"
EPOCHS = 8
SEED = 0


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgetk" / "quickstart"


def data_dir() -> Path:
    from toolkit.resources import calibration_dir

    path = calibration_dir() / "digits"
    for name in ("train.npz", "calibration.npz", "eval.npz", "labels.txt"):
        if not (path / name).is_file():
            raise UsageError(f"The shipped example data {path / name} is missing.",
                             hint="Reinstall edge-toolkit (the calibration/ folder ships with it).")
    return path


def _keras_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("keras")
    except metadata.PackageNotFoundError:
        raise MissingDependency("keras", extra="tf", purpose="to train the quickstart's example model") from None


def model_path(progress: Callable[[str], None]) -> Path:
    """The trained example model: from the cache, or trained now and cached (written atomically)."""
    data = data_dir() / "train.npz"
    key = hashlib.sha256(data.read_bytes() + _keras_version().encode() + f"{EPOCHS}/{SEED}".encode()).hexdigest()
    target = cache_dir() / key[:16] / MODEL_FILE
    if target.is_file():
        progress(f"using the example model cached at {target}")
        return target
    progress("training the example model (a small CNN on the 8x8 digits, once; it is cached)")
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    with np.load(data) as npz:
        x = npz["x"].astype(np.float32) / 16.0  # uint8 0..16 -> [0, 1], as calibration.npz and eval.npz
        y = npz["y"].astype(np.int64)
    from toolkit.quiet import import_tensorflow_quietly, native_stderr_silenced

    import_tensorflow_quietly()
    with native_stderr_silenced():
        net = train(x, y)
    fd, tmp_name = tempfile.mkstemp(prefix=".digits-", suffix=".keras", dir=target.parent)
    os.close(fd)
    try:
        net.save(tmp_name)
        os.replace(tmp_name, target)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    progress(f"trained in {time.perf_counter() - started:.1f} s -> {target}")
    return target


def train(x: np.ndarray, y: np.ndarray) -> Any:
    """A Functional Keras CNN (input ``image``, (None, 8, 8, 1)) trained for a few epochs, deterministically."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import keras
    except ImportError:
        raise MissingDependency("keras", extra="tf", purpose="to train the quickstart's example model") from None
    keras.utils.set_random_seed(SEED)
    inputs = keras.Input(shape=(8, 8, 1), name="image")
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    outputs = keras.layers.Dense(10, activation="softmax", name="probabilities")(h)
    net = keras.Model(inputs, outputs, name="digits")
    net.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    net.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0, shuffle=True)
    return net
