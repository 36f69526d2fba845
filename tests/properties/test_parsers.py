"""Property tests for every parser of user files: whatever garbage comes in, the answer is a parsed value or a
ToolkitError (one plain message), never another exception; and what is valid survives a round trip.

Parsers: the manifest (``read_manifest``, ``read_bundle``), target profiles (``load_profiles`` over a
folder of TOML files), the inventory (``parse_inventory``, ``load_inventory``), an image folder's
``dataset.toml`` (``calibration.read_data``), and ``--input-shape`` (``parse_input_shapes``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.fixtures.deploy import build_bundle
from toolkit.delivery.bundle import read_bundle
from toolkit.conversion.calibration import read_data
from toolkit.model.flags import parse_input_shapes
from toolkit.devices.inventory import load_inventory, parse_inventory
from toolkit.model.schemas.inventory import Device as InventoryDevice
from toolkit.errors import ToolkitError
from toolkit.model.targets import load_profiles
from toolkit.model.manifest import read_manifest
from toolkit.model.manifest import Manifest
from toolkit.model.tensors import TensorSpec

REPO = Path(__file__).resolve().parents[2]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------------------------------ generic data

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
toml_scalars = st.one_of(st.booleans(), st.integers(-(2**31), 2**31), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=12))
toml_values = st.one_of(toml_scalars, st.lists(toml_scalars, max_size=3))


def _toml_str(text: str) -> str:
    """A TOML basic string (JSON's escapes, minus the surrogate pairs TOML does not allow)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_dumps(data: dict[str, Any]) -> str:
    """A small TOML writer (scalars, arrays, tables, arrays of tables): enough to feed the parsers."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v) if not isinstance(v, float) or math.isfinite(v) else "nan"
        if isinstance(v, str):
            return _toml_str(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(type(v))

    def key(k: str) -> str:
        return _toml_str(k)

    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for k, v in data.items():
        if isinstance(v, dict) or (isinstance(v, list) and v and all(isinstance(x, dict) for x in v)):
            tables.append((k, v))
        else:
            lines.append(f"{key(k)} = {value(v)}")

    def emit(prefix: str, k: str, v: Any) -> None:
        name = f"{prefix}.{key(k)}" if prefix else key(k)
        if isinstance(v, dict):
            lines.append(f"[{name}]")
            nested = []
            for kk, vv in v.items():
                if isinstance(vv, dict) or (isinstance(vv, list) and vv and all(isinstance(x, dict) for x in vv)):
                    nested.append((kk, vv))
                else:
                    lines.append(f"{key(kk)} = {value(vv)}")
            for kk, vv in nested:
                emit(name, kk, vv)
        else:
            for item in v:
                lines.append(f"[[{name}]]")
                for kk, vv in item.items():
                    lines.append(f"{key(kk)} = {value(vv)}")

    for k, v in tables:
        emit("", k, v)
    return "\n".join(lines) + "\n"


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], values: st.SearchStrategy[Any] = json_values) -> dict[str, Any]:
    """``base`` with a few random edits: a key removed, a value replaced, a key added, anywhere in the tree."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        node: Any = data
        for _ in range(draw(st.integers(0, 3))):
            children = list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []
            children = [(k, v) for k, v in children if isinstance(v, (dict, list)) and v]
            if not children:
                break
            node = draw(st.sampled_from(children))[1]
        if isinstance(node, dict) and node:
            k = draw(st.sampled_from(sorted(node, key=str)))
            action = draw(st.sampled_from(["delete", "replace", "add"]))
            if action == "delete":
                del node[k]
            elif action == "replace":
                node[k] = draw(values)
            else:
                node[draw(st.text(min_size=1, max_size=8))] = draw(values)
        elif isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(values)
    return data


@contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="edgetk-prop-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------------------ manifest

@pytest.fixture(scope="module")
def valid_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("prop") / "b", name="prop", target="generic-x86_64",
                        target_arch="x86_64")


@pytest.fixture(scope="module")
def manifest_dict(valid_bundle: Path) -> dict[str, Any]:
    return json.loads((valid_bundle / "manifest.json").read_text())  # type: ignore[no-any-return]


def _manifest_or_error(data: Any) -> Manifest | None:
    try:
        return read_manifest(data, where="manifest.json")
    except ToolkitError:
        return None


@SETTINGS
@given(data=json_values)
def test_manifest_from_any_json_value(data: Any) -> None:
    _manifest_or_error(data)


@SETTINGS
@given(data=st.data())
def test_manifest_from_a_damaged_manifest(manifest_dict: dict[str, Any], data: st.DataObject) -> None:
    _manifest_or_error(data.draw(mutated(manifest_dict)))


@SETTINGS
@given(
    name=st.from_regex(r"[a-z0-9][a-z0-9._-]{0,30}", fullmatch=True),
    shape=st.lists(st.integers(1, 4096), min_size=1, max_size=5),
    dtype=st.sampled_from(["float32", "int8", "uint8", "float16", "int32"]),
    labels=st.none() | st.lists(st.text(min_size=1, max_size=10), max_size=5),
)
def test_manifest_round_trip(manifest_dict: dict[str, Any], name: str, shape: list[int], dtype: str,
                             labels: list[str] | None) -> None:
    data = copy.deepcopy(manifest_dict)
    data["name"] = name
    data["labels"] = labels
    data["artifacts"][0]["inputs"][0].update(shape=shape, dtype=dtype)
    manifest = read_manifest(data)
    assert manifest.name == name and manifest.artifacts[0].inputs[0].shape == tuple(shape)
    again = read_manifest(json.loads(json.dumps(manifest.to_dict())))
    assert again == manifest
    assert again.to_dict() == manifest.to_dict()


@FEW
@given(raw=st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())))
def test_read_bundle_with_any_manifest_bytes(valid_bundle: Path, raw: bytes) -> None:
    with scratch() as root:
        bundle = root / "b"
        shutil.copytree(valid_bundle, bundle)
        (bundle / "manifest.json").write_bytes(raw)
        try:
            read_bundle(bundle).files()
        except ToolkitError:
            pass


@FEW
@given(data=st.data())
def test_read_bundle_with_a_damaged_manifest(valid_bundle: Path, manifest_dict: dict[str, Any],
                                             data: st.DataObject) -> None:
    with scratch() as root:
        bundle = root / "b"
        shutil.copytree(valid_bundle, bundle)
        (bundle / "manifest.json").write_text(json.dumps(data.draw(mutated(manifest_dict))))
        try:
            files = read_bundle(bundle).files()
        except ToolkitError:
            return
        for f in files:  # whatever was accepted stays inside the bundle
            assert (bundle / f.path).resolve().is_relative_to(bundle.resolve())


# ------------------------------------------------------------------------------------------ target profiles

@pytest.fixture(scope="module")
def profile_dict() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((REPO / "targets" / "generic-x86_64.toml").read_text())


def _load_profile_file(text: str, name: str = "my-board") -> Any:
    with scratch() as root:
        (root / f"{name}.toml").write_text(text)
        try:
            return load_profiles(targets_dirs=[root]).get(name)
        except ToolkitError:
            return None


@SETTINGS
@given(text=st.text(max_size=300))
def test_profile_from_any_text(text: str) -> None:
    _load_profile_file(text)


@SETTINGS
@given(data=st.data())
def test_profile_from_a_damaged_profile(profile_dict: dict[str, Any], data: st.DataObject) -> None:
    base = dict(profile_dict, name="my-board")
    damaged = data.draw(mutated(base, toml_values))
    try:
        text = toml_dumps(damaged)
    except TypeError:
        assume(False)
    _load_profile_file(text)


@SETTINGS
@given(
    budget=st.floats(0.01, 1e5), threads=st.integers(1, 64), memory=st.integers(64, 1 << 20),
    cores=st.integers(1, 128), drop=st.floats(0, 1), cosine=st.floats(0, 1),
)
def test_profile_round_trip(profile_dict: dict[str, Any], budget: float, threads: int, memory: int, cores: int,
                            drop: float, cosine: float) -> None:
    data = copy.deepcopy(profile_dict)
    data.update(name="my-board", latency_budget_ms=budget, threads=threads, memory_mb=memory)
    data["cpu"]["cores"] = cores
    data["tolerance"] = {"max_top1_drop": drop, "min_cosine": cosine}
    profile = _load_profile_file(toml_dumps(data))
    assert profile is not None
    assert profile.latency_budget_ms == pytest.approx(budget) and profile.threads == threads
    assert profile.memory_mb == memory


# ------------------------------------------------------------------------------------------ inventory

device_names = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True).filter(lambda n: n != "local")
hosts = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,30}", fullmatch=True)
plain = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=20).filter(
    lambda s: s.strip() != "")


@st.composite
def device_entry(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {"host": draw(hosts)}
    if draw(st.booleans()):
        entry["port"] = draw(st.integers(1, 65535))
    for key in ("user", "identity_file", "python", "target", "known_hosts"):
        if draw(st.booleans()):
            entry[key] = draw(plain)
    if draw(st.booleans()):
        entry["groups"] = draw(st.lists(plain, max_size=3))
    return entry


@SETTINGS
@given(data=json_values)
def test_inventory_from_any_value(data: Any) -> None:
    try:
        parse_inventory(data if isinstance(data, dict) else {"devices": data}, where="inv.toml")
    except ToolkitError:
        pass


@SETTINGS
@given(devices=st.dictionaries(st.text(max_size=10),
                               st.dictionaries(st.sampled_from([*(f.name for f in dataclasses.fields(InventoryDevice)), "hots"]), json_values,
                                               max_size=5), max_size=3))
def test_inventory_from_random_device_tables(devices: dict[str, Any]) -> None:
    try:
        parse_inventory({"devices": devices}, where="inv.toml")
    except ToolkitError:
        pass


@SETTINGS
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_inventory_file_from_any_bytes(raw: bytes) -> None:
    with scratch() as root:
        (root / "inv.toml").write_bytes(raw)
        try:
            load_inventory(root / "inv.toml")
        except ToolkitError:
            pass


@SETTINGS
@given(devices=st.dictionaries(device_names, device_entry(), min_size=1, max_size=4))
def test_inventory_round_trip(devices: dict[str, dict[str, Any]]) -> None:
    with scratch() as root:
        (root / "inv.toml").write_text(toml_dumps({"devices": devices}))
        specs = load_inventory(root / "inv.toml")
    assert list(specs) == list(devices)
    for name, entry in devices.items():
        spec = specs[name]
        assert spec.name == name and spec.host == entry["host"] and spec.port == entry.get("port")
        for key in ("user", "identity_file", "python", "target", "known_hosts"):
            assert getattr(spec, key) == entry.get(key)
        assert spec.groups == tuple(entry.get("groups", ()))


# ------------------------------------------------------------------------------------------ dataset.toml

@pytest.fixture(scope="module")
def image_bytes() -> bytes:
    return (REPO / "calibration" / "digits-images" / "000.png").read_bytes()


IMAGE_INPUT = (TensorSpec("image", (1, 8, 8, 1), "float32"),)
DATASET_KEYS = ["size", "layout", "color_order", "mean", "std", "scale", "input", "dtype"]
dataset_values = st.one_of(
    toml_values, st.sampled_from(["NHWC", "NCHW", "RGB", "BGR", "GRAY", "image", "float32", "uint8", "int8"]),
    st.lists(st.integers(-3, 300), max_size=4), st.lists(st.floats(-300, 300), max_size=4),
)


def _read_folder(image_bytes: bytes, text: str) -> Any:
    with scratch() as root:
        (root / "dataset.toml").write_text(text)
        (root / "000.png").write_bytes(image_bytes)
        try:
            return read_data(root, IMAGE_INPUT)
        except ToolkitError:
            return None


@FEW
@given(text=st.text(max_size=200))
def test_dataset_toml_from_any_text(image_bytes: bytes, text: str) -> None:
    _read_folder(image_bytes, text)


@SETTINGS
@given(config=st.dictionaries(st.sampled_from([*DATASET_KEYS, "layot"]), dataset_values, max_size=5))
def test_dataset_toml_from_random_keys(image_bytes: bytes, config: dict[str, Any]) -> None:
    _read_folder(image_bytes, toml_dumps(config))


@FEW
@given(scale=st.floats(1e-4, 10), layout=st.sampled_from(["NHWC", "NCHW"]), size=st.integers(2, 16))
def test_dataset_toml_valid_configs_are_applied(image_bytes: bytes, scale: float, layout: str, size: int) -> None:
    spec = (TensorSpec("image", (1, size, size, 1) if layout == "NHWC" else (1, 1, size, size), "float32"),)
    with scratch() as root:
        (root / "dataset.toml").write_text(toml_dumps(
            {"size": [size, size], "layout": layout, "color_order": "GRAY", "scale": scale}))
        (root / "000.png").write_bytes(image_bytes)
        data = read_data(root, spec)
    (array,) = data.arrays.values() if hasattr(data, "arrays") else data.data.values()
    assert array.shape == ((1, size, size, 1) if layout == "NHWC" else (1, 1, size, size))
    assert float(array.max()) <= 255 * scale * (1 + 1e-6)


# ------------------------------------------------------------------------------------------ --input-shape

@SETTINGS
@given(values=st.lists(st.text(max_size=20), max_size=3))
def test_input_shape_from_any_text(values: list[str]) -> None:
    try:
        shapes = parse_input_shapes(values)
    except ToolkitError:
        return
    assert all(name and dims and all(d > 0 for d in dims) for name, dims in shapes.items())


@SETTINGS
@given(shapes=st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_:./-]{0,15}", fullmatch=True),
                              st.lists(st.integers(1, 10_000), min_size=1, max_size=5).map(tuple), max_size=4))
def test_input_shape_round_trip(shapes: dict[str, tuple[int, ...]]) -> None:
    values = [f"{name}={','.join(map(str, dims))}" for name, dims in shapes.items()]
    assert parse_input_shapes(values) == shapes
