"""The public Python API (toolkit.convert/deploy/check/run/inspect/...): real conversion, the real runner on
the ``local`` device (with the device-side venv's python), results equal to what the CLI prints."""

from __future__ import annotations

import importlib
import inspect as pyinspect
import json
import pkgutil
from pathlib import Path

import pytest

import toolkit
from tests.fixtures.cli import run_edgetk
from tests.fixtures.home import home_scope
from tests.fixtures.runs import NO_GATES

VERBS = ("convert", "deploy", "check", "run", "inspect", "rollback", "status", "remove", "probe", "setup", "optimize",
         "quickstart", "history", "make_report", "list_targets", "show_target", "prune", "add_key")


@pytest.mark.fast
def test_verbs_stay_functions_after_every_submodule_is_imported():
    for info in pkgutil.walk_packages(toolkit.__path__, "toolkit."):
        if info.name.startswith(("toolkit.device_side.", "toolkit.store.migrations")) or info.name.endswith("__main__"):
            continue  # scripts (the device-side runner, Alembic's migrations, python -m entry points), not the API
        try:
            importlib.import_module(info.name)
        except ImportError as exc:  # an optional extra that is not installed is fine; our own module is not
            assert not str(getattr(exc, "name", "")).startswith("toolkit"), exc
    for verb in VERBS:
        assert pyinspect.isfunction(getattr(toolkit, verb)), verb
    assert set(toolkit.__all__) >= {"convert", "deploy", "check", "run", "inspect"}


@pytest.mark.fast
def test_api_functions_are_keyword_only_after_their_subject():
    from toolkit import api

    for name in ("convert", "deploy", "check", "run", "inspect", "rollback", "remove", "prune"):
        params = list(pyinspect.signature(getattr(api, name)).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert len(positional) <= 1, (name, positional)
    for name in ("status", "probe", "add_key"):
        params = pyinspect.signature(getattr(api, name)).parameters.values()
        assert all(p.kind == p.KEYWORD_ONLY for p in params), name


def test_run_result_matches_the_contract(checked_bundle):
    result = checked_bundle.result
    assert result.passed and result.exit_code == 0 and result.failed_stage is None
    doc = result.to_dict()
    manifest = json.loads((checked_bundle.bundle / "manifest.json").read_text())
    assert doc["manifest"] == manifest
    assert [a["file"] for a in manifest["artifacts"]] == ["model.fp32.tflite", "model.int8.tflite"]
    (device,) = doc["devices"]
    assert device["device"] == "here" and device["ok"] and device["error"] is None
    assert device["deploy"]["files_sent"] == device["deploy"]["files_total"] > 0
    assert sorted(r["artifact"] for r in device["reports"]) == sorted(a["file"] for a in manifest["artifacts"])
    for report in device["reports"]:
        assert report["error"] is None and report["outputs_match"]["ok"] is True
        assert report["runs"] == 10 and 0 < report["latency_ms"]["p50"] <= report["latency_ms"]["p90"]
        assert report["runtime"]["name"] == "litert"
        assert report["check_id"]
    int8 = next(a for a in manifest["artifacts"] if a["precision"] == "int8")
    assert int8["verification"]["accuracy"] > 0.9  # a real model, really quantized
    assert int8["bytes"] < 0.5 * next(a for a in manifest["artifacts"] if a["precision"] == "fp32")["bytes"]
    json.dumps(doc)  # serialisable as it is


def test_check_status_inspect_and_rollback_errors(checked_bundle):
    from toolkit import api
    from toolkit.errors import UsageError

    second = checked_bundle.second
    assert second.passed and second.exit_code == 0
    assert {r.artifact for r in second.reports} == {"model.fp32.tflite", "model.int8.tflite"}
    assert set(second.to_dict()) == {"passed", "devices", "store"}  # store: where the reports went
    assert second.to_dict()["store"]["ok"] and second.to_dict()["store"]["recorded"] == 2

    info = api.inspect(checked_bundle.bundle)
    assert isinstance(info, api.BundleInspection)
    assert [a.precision for a in info.artifacts] == ["fp32", "int8"]
    assert info.artifacts[1].quantized_ops > 0
    single = api.inspect(checked_bundle.bundle / "model.int8.tflite")
    assert single.to_dict() == info.artifacts[1].to_dict()

    with home_scope(checked_bundle.home):
        state = api.status(devices=[checked_bundle.device])
        answer = state.devices[0].answer  # typed: a StatusAnswer, its bundles InstalledBundle records
        assert answer is not None and answer.bundles["digits-api"].current
        (version,) = answer.bundles["digits-api"].versions
        assert version.version == answer.bundles["digits-api"].current and version.by and version.by.pid
        assert state.to_dict()["devices"][0]["bundles"] == answer.to_dict()["bundles"]
        back = api.rollback("digits-api", devices=[checked_bundle.device])  # only one version installed
    assert not back.passed and back.exit_code == 2 and back.devices[0].error
    assert back.devices[0].answer is None and "current" not in back.to_dict()["devices"][0]
    with pytest.raises(UsageError, match="No device given"):
        api.check(checked_bundle.bundle)
    with pytest.raises(UsageError, match="does not exist"):
        api.inspect(checked_bundle.bundle / "nope.onnx")


def test_gate_failure_is_data_not_an_exception(checked_bundle):
    from toolkit import api

    with home_scope(checked_bundle.home):
        report = api.check(checked_bundle.bundle, devices=[checked_bundle.device], runs=3, budget_ms=1e-6,
                           baseline="none", store=checked_bundle.store.with_name("other.sqlite"))
    assert not report.passed and report.exit_code == 1
    assert "exceeds the budget" in report.devices[0].error


# Keys whose values differ from one run to the next (times, ids, where the output went); numbers are
# measurements except these counts, which must agree.
VOLATILE = {"created_at", "installed_at", "check_id", "run_id", "bundle", "out", "seconds", "version", "current",
            "previous", "versions", "sha256", "selected"}  # selected: decided by the device's own timings
COUNTS = {"runs", "warmup", "files_sent", "files_total", "files_reused", "bytes", "exit_code", "samples"}


def _normal(value, roots, key=""):  # type: ignore[no-untyped-def]
    """A --json document with the volatile fields blanked, so two runs of the same command compare equal."""
    if key in VOLATILE:
        return "<volatile>"
    if isinstance(value, dict):
        return {k: _normal(v, roots, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v, roots, key) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in COUNTS:
        return "<number>"
    if isinstance(value, str):
        for root in roots:
            value = value.replace(str(root), "<root>")
    return value


def test_json_of_the_api_equals_the_cli_for_every_verb(checked_bundle, deploy_bundle_factory, device_env,  # type: ignore[no-untyped-def]
                                                       tmp_path):
    """Each command's --json document is its API function's ``to_dict()``: side by side, the CLI in one
    private HOME (the ``local`` device's state) and the API in another, on the same inputs."""
    from toolkit import api

    store = checked_bundle.store
    same = {  # read-only verbs: exactly equal
        ("inspect", checked_bundle.bundle): api.inspect(checked_bundle.bundle),
        ("targets", "list"): api.list_targets(),
        ("targets", "show", "raspberry-pi-4"): api.show_target("raspberry-pi-4"),
        ("history", "--store", store): api.history(store=store),
        ("history", "--store", store, "--device", "here", "--limit", "1"): api.history(store=store, device="here",
                                                                                        limit=1),
        ("report", checked_bundle.bundle, "--store", store): api.make_report(checked_bundle.bundle, store=store),
        ("report", "--history", "--store", store): api.make_report(whole_history=True, store=store),
    }
    for args, result in same.items():
        cli = run_edgetk(*args, "--json")
        assert cli.code == 0, (args, cli.stderr)
        assert cli.json() == json.loads(json.dumps(result.to_dict())), args

    bundle = deploy_bundle_factory(name="front-door")
    homes = {side: tmp_path / side for side in ("cli", "api")}
    for home in homes.values():
        home.mkdir()
    roots = [*homes.values(), tmp_path]

    def inventory(side: str) -> Path:
        path = tmp_path / f"{side}.toml"
        path.write_text(f'[devices.here]\nhost = "local"\npython = "{device_env.python}"\n')
        return path

    gates = ["--budget-ms", "100000", "--baseline", "none", "--runs", "5"]
    steps = [  # (CLI arguments after the verb, the same call through the API); one device state per side
        (["deploy", bundle, "--check", *gates],
         lambda inv, st: api.deploy(bundle, inventory=inv, check=True, runs=5, store=st, progress_stream=None,
                                    **NO_GATES)),
        (["check", bundle, *gates], lambda inv, st: api.check(bundle, inventory=inv, runs=5, store=st, **NO_GATES)),
        (["status"], lambda inv, st: api.status(inventory=inv)),
        (["rollback", "front-door"], lambda inv, st: api.rollback("front-door", inventory=inv)),
        (["devices", "probe"], lambda inv, st: api.probe(inventory=inv)),
        (["prune", "front-door"], lambda inv, st: api.prune("front-door", inventory=inv)),
        (["remove", "front-door"], lambda inv, st: api.remove("front-door", inventory=inv)),
    ]
    for argv, call in steps:
        st = {side: homes[side] / "history.sqlite" for side in homes}
        store_args = ["--store", st["cli"]] if argv[0] in ("deploy", "check") else []
        cli = run_edgetk(*argv, *store_args, "--inventory", inventory("cli"), "--json",
                         env={"HOME": str(homes["cli"])})
        with home_scope(homes["api"]):
            result = call(inventory("api"), st["api"])
        assert cli.code == result.exit_code, (argv, cli.stderr)
        assert _normal(cli.json(), roots) == _normal(json.loads(json.dumps(result.to_dict())), roots), argv
    after = run_edgetk("status", "--inventory", inventory("cli"), "--json", env={"HOME": str(homes["cli"])}).json()
    assert after["devices"][0]["bundles"] == {}  # the steps really ran on the device: remove came last
    # convert and run of a small ONNX model (no TensorFlow), each side to its own folder
    source = bundle / "model.fp32.onnx"
    options = ["--precision", "fp32", "--format", "onnx", "--no-cache", "--name", "door"]
    cli = run_edgetk("convert", source, *options, "--out", tmp_path / "c-cli", "--json")
    built = api.convert(source, precisions=["fp32"], formats=["onnx"], use_cache=False, name="door",
                        out=tmp_path / "c-api", progress=lambda m: None)
    assert cli.code == 0, cli.stderr
    assert _normal(cli.json(), roots) == _normal(built.to_dict(), roots)
    cli = run_edgetk("run", source, *options, *gates, "--inventory", inventory("cli"), "--out", tmp_path / "r-cli",
                     "--store", homes["cli"] / "run.sqlite", "--json", env={"HOME": str(homes["cli"])})
    assert cli.code == 0, cli.stderr
    cli_doc = cli.json()
    with home_scope(homes["api"]):
        ran = api.run(source, precisions=["fp32"], formats=["onnx"], use_cache=False, name="door",
                      out=tmp_path / "r-api", inventory=inventory("api"), runs=5, store=homes["api"] / "run.sqlite",
                      progress=lambda m: None, progress_stream=None, config=cli_doc["config"], **NO_GATES)
    assert _normal(cli_doc, roots) == _normal(ran.to_dict(), roots)
    # optimize --load-time of the same artifact
    cli = run_edgetk("optimize", source, "--load-time", "--repeats", "1", "--out", homes["cli"] / "opt", "--json")
    assert cli.code == 0, cli.stderr
    measured = api.optimize(source, load_time=True, repeats=1, out=homes["api"] / "opt")
    assert _normal(cli.json(), roots) == _normal(json.loads(json.dumps(measured.to_dict())), roots)


@pytest.mark.fast
def test_run_refuses_unknown_keywords_and_bad_devices_before_converting(tmp_path):
    from toolkit import api
    from toolkit.errors import UsageError

    with pytest.raises(TypeError, match="colour"):
        api.run("model.keras", devices=["local"], colour=True)
    with pytest.raises(UsageError, match="not a device spec"):
        api.run(tmp_path / "missing.keras", devices=["not a spec!"])
    assert not (tmp_path / "bundles").exists()


def _toolkit_imports() -> dict[str, set[str]]:
    """Every toolkit module -> the toolkit modules it imports anywhere (module level or inside functions)."""
    import ast

    root = Path(toolkit.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        if "device_side" in path.parts or "migrations" in path.parts:
            continue
        name = ".".join(("toolkit", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        modules[name] = path

    def owner(target: str) -> str:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                found = owner(target) if target.startswith("toolkit.") else ""
                # a module's own package (its __init__) is not a dependency edge: Python imports it first anyway
                if found and found != name and found != "toolkit" and not name.startswith(found + "."):
                    graph[name].add(found)
    return graph


@pytest.mark.fast
def test_no_import_cycles_between_toolkit_modules():
    graph = _toolkit_imports()
    assert "toolkit.example" not in graph["toolkit.api"] or "toolkit.api" not in graph["toolkit.example"]
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert cycles == [], "import cycles (break them by moving the shared piece down): " + "; ".join(
        " -> ".join(c) for c in cycles)



def _floors() -> dict[str, int]:
    """docs/design.md's floor table: room (``toolkit/x.py`` or ``toolkit/x/``) -> its floor."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    table = text[text.index("## The rooms, floor by floor"):]
    table = table[table.index("```") + 3:]
    table = table[:table.index("```")]
    floors: dict[str, int] = {}
    floor = 0
    for line in table.splitlines():
        found = re.match(r"^(?:floor\s+(\d+))?\s+(toolkit/[\w.]+/?)", line)
        if found:
            floor = int(found.group(1)) if found.group(1) else floor
            floors[found.group(2)] = floor
    return floors


@pytest.mark.fast
def test_rooms_import_only_lower_floors():
    """Every room of toolkit/ stands on docs/design.md's floor table, and imports only rooms below it."""
    floors = _floors()
    root = Path(toolkit.__file__).parent

    def room(module: str) -> str:
        parts = module.split(".")
        if len(parts) == 2 and parts[1] == "__init__" or len(parts) == 1:
            return "toolkit/__init__.py"
        return f"toolkit/{parts[1]}/" if (root / parts[1]).is_dir() else f"toolkit/{parts[1]}.py"

    rooms = {f"toolkit/{p.name}/" if p.is_dir() else f"toolkit/{p.name}" for p in root.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert rooms <= set(floors), f"rooms missing from docs/design.md's floor table: {sorted(rooms - set(floors))}"
    upward = []
    for module, imported in _toolkit_imports().items():
        source = room(module if "." in module else module + ".__init__")
        for target in imported:
            destination = room(target)
            if destination != source and floors[destination] >= floors[source]:
                upward.append(f"{module} -> {target} ({source} floor {floors[source]}, {destination} floor "
                              f"{floors[destination]})")
    assert upward == [], "imports that run up the floors (move the shared piece down): " + "; ".join(sorted(upward))


@pytest.mark.fast
def test_deploy_and_check_never_import_the_converter():
    """The bundle's layout is its contract (toolkit.delivery.bundle): checks/, delivery/ and devices/ read a
    bundle by it and never reach conversion/, directly or through another module, at load time or inside a
    function (architecture.md: deploy and check never import convert)."""
    graph = _toolkit_imports()
    reached = []
    for start in sorted(graph):
        if not start.startswith(("toolkit.checks", "toolkit.delivery", "toolkit.devices")):
            continue
        seen, path = {start}, {start: [start]}
        todo = [start]
        while todo:
            node = todo.pop()
            for nxt in sorted(graph[node]):
                if nxt not in seen:
                    seen.add(nxt)
                    path[nxt] = [*path[node], nxt]
                    todo.append(nxt)
        reached += [" -> ".join(path[m]) for m in sorted(seen) if m.startswith("toolkit.conversion")][:1]
    assert reached == [], "the converter reached from deploy or check: " + "; ".join(reached)
