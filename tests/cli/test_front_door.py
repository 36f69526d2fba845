"""The front door, in-process through click's CliRunner (no device, no conversion): every command is a thin
layer over one ``toolkit.api`` function, its flags come from the one option table, and a failing ``--json``
command still prints exactly one JSON document on stdout, with the plain error on stderr."""

from __future__ import annotations

import inspect
import json
import socket
from collections.abc import Callable
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from toolkit import api
from toolkit.cli import cli
from toolkit.model.flags import options_of
from toolkit.model.options import CheckOptions, ConvertOptions, DeviceOptions

pytestmark = pytest.mark.fast

# command path -> (the name of the api function it calls, CLI parameter -> api keyword where the names differ;
# None: a CLI-only parameter, such as a format selector with one choice so far)
FRONT_DOOR: dict[tuple[str, ...], tuple[str, dict[str, str | None]]] = {
    ("convert",): ("convert", {"no_cache": "use_cache"}),
    ("inspect",): ("inspect", {}),
    ("targets", "list"): ("list_targets", {}),
    ("targets", "show"): ("show_target", {}),
    ("deploy",): ("deploy", {}),
    ("check",): ("check", {}),
    ("rollback",): ("rollback", {}),
    ("status",): ("status", {}),
    ("remove",): ("remove", {}),
    ("prune",): ("prune", {}),
    ("devices", "add-key"): ("add_key", {}),
    ("devices", "probe"): ("probe", {}),
    ("devices", "setup"): ("setup", {}),
    ("history",): ("history", {}),
    ("history", "sync"): ("history_sync", {}),
    ("history", "import"): ("history_import", {}),
    ("export",): ("export_mender", {"mender": None}),
    ("report",): ("make_report", {}),
    ("optimize",): ("optimize", {}),
    ("run",): ("run", {"no_cache": "use_cache", "force_deploy": "deploy_force", "config": "config"}),
    ("quickstart",): ("quickstart", {}),
}


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command | None = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.get_command(click.Context(command), name)
    assert command is not None, path
    return command


def _paths(group: click.Group, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            out |= _paths(command, (*prefix, name))
        if not isinstance(command, click.Group) or command.invoke_without_command:
            out.add((*prefix, name))
    return out


def test_every_command_has_one_api_function_taking_all_its_flags() -> None:
    assert _paths(cli) == set(FRONT_DOOR)
    for path, (function_name, renamed) in FRONT_DOOR.items():
        function = getattr(api, function_name)
        accepted = set(inspect.signature(function).parameters)
        if function is api.optimize:  # its **techniques are toolkit.optimization.optimize's keywords
            from toolkit.optimization import optimize

            accepted |= set(inspect.signature(optimize).parameters)
        for param in _command(path).params:
            name = param.name or ""
            if name == "as_json" or (name in renamed and renamed[name] is None):
                continue
            assert renamed.get(name, name) in accepted, (path, name, function_name)


@pytest.mark.parametrize("path", [("convert",), ("run",)])
def test_convert_flags_are_generated_from_convert_options(path: tuple[str, ...]) -> None:
    params = {p.name: p for p in _command(path).params}
    for option in options_of(ConvertOptions):
        param = params[option.param]
        assert option.long in param.opts, option
        assert param.multiple == option.flag.multiple
        if not option.flag.multiple:
            assert param.default == (False if option.flag.inverted else option.default), option
    flagged = {o.field for o in options_of(ConvertOptions)}
    assert flagged | {"source", "workdir"} == {f for f in ConvertOptions.__dataclass_fields__}


@pytest.mark.parametrize("path, groups", [
    (("deploy",), (DeviceOptions, CheckOptions)), (("check",), (DeviceOptions, CheckOptions)),
    (("run",), (ConvertOptions, DeviceOptions, CheckOptions)), (("status",), (DeviceOptions,)),
    (("devices", "probe"), (DeviceOptions,)), (("devices", "setup"), (DeviceOptions,)),
])
def test_shared_option_groups_are_on_every_command_that_takes_them(path: tuple[str, ...], groups: tuple[type, ...]
                                                                   ) -> None:
    params = {p.name for p in _command(path).params}
    signature = inspect.signature(getattr(api, FRONT_DOOR[path][0])).parameters
    for group in groups:
        for option in options_of(group):
            assert option.param in params, (path, option.field)
            assert option.field in signature, (path, option.field)


def test_the_keywords_the_type_checker_sees_are_the_option_groups_fields() -> None:
    """``**options: Unpack[...Keywords]`` (toolkit.api.keywords) lets mypy check a caller's keywords; each
    TypedDict names exactly its group's flagged fields (a field added to a group without its keyword fails here),
    and each verb's keywords are the groups its CLI command takes."""
    from toolkit.api import keywords
    from toolkit.model.options import RolloutOptions

    def fields(*groups: type) -> set[str]:
        return {o.field for group in groups for o in options_of(group)}

    assert set(keywords.ConvertKeywords.__annotations__) == fields(ConvertOptions)
    assert set(keywords.ReachKeywords.__annotations__) | {"devices"} == fields(DeviceOptions)
    assert set(keywords.DeviceKeywords.__optional_keys__) == fields(DeviceOptions)
    assert set(keywords.CheckKeywords.__annotations__) == fields(CheckOptions)
    assert set(keywords.RolloutKeywords.__annotations__) == fields(RolloutOptions)
    assert set(keywords.DeployKeywords.__optional_keys__) == fields(DeviceOptions, CheckOptions, RolloutOptions)
    assert set(keywords.FleetCheckKeywords.__optional_keys__) == fields(DeviceOptions, CheckOptions)
    assert set(keywords.RunKeywords.__optional_keys__) == fields(ConvertOptions, DeviceOptions, CheckOptions)


def test_api_refuses_an_unknown_option_naming_it() -> None:
    with pytest.raises(TypeError, match="colour"):
        api.deploy("bundle", devices=["local"], colour=True)
    with pytest.raises(TypeError, match="colour"):
        api.convert("model.keras", colour=True)


def _invoke(*args: Any) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _one_error_document(result: Result, code: int, kind: str, needle: str) -> dict[str, Any]:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    doc = json.loads(result.stdout)  # exactly one document: json.loads refuses trailing text
    assert doc["passed"] is False and doc["exit_code"] == code
    assert doc["error"]["kind"] == kind and needle in doc["error"]["message"], doc
    assert needle in result.stderr and "Traceback" not in result.stderr  # the plain error on stderr as well
    return doc


@pytest.mark.parametrize("args, code, kind, needle", [
    (("convert", "no-such-model.keras", "--json"), 2, "UsageError", "does not exist"),
    (("convert", "model.keras", "--precision", "int9", "--json"), 2, "BadParameter", "int9"),
    (("convert", "model.keras", "--no-such-flag", "--json"), 2, "NoSuchOption", "--no-such-flag"),
    (("inspect", "no-such.onnx", "--json"), 2, "UsageError", "does not exist"),
    (("targets", "show", "raspbery-pi-5", "--json"), 2, "UsageError", "raspbery-pi-5"),
    (("report", "--json"), 2, "UsageError", "BUNDLE directory or --history"),
    (("check", "no-such-bundle", "--device", "local", "--runs", "0", "--json"), 2, "BadParameter", "--runs"),
    (("devices", "setup", "--device", "local", "--venv", "~", "--json"), 2, "UsageError", "--venv ~"),
    (("run", "--json"), 2, "UsageError", "No SOURCE given"),
    (("--json", "convert", "model.keras"), 2, "NoSuchOption", "--json"),
    (("no-such-command", "--json"), 2, "NoSuchCommand", "no-such-command"),
], ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_a_failing_json_command_prints_one_error_document(args: tuple[str, ...], code: int, kind: str,
                                                          needle: str) -> None:
    _one_error_document(_invoke(*args), code, kind, needle)


def test_without_json_stdout_stays_empty_on_error() -> None:
    result = _invoke("inspect", "no-such.onnx")
    assert result.exit_code == 2 and result.stdout == "" and "does not exist" in result.stderr


def test_the_api_error_and_the_cli_error_document_agree() -> None:
    from toolkit.cli._output import error_document
    from toolkit.errors import UsageError

    with pytest.raises(UsageError) as caught:
        api.setup(devices=["local"], venv="~")
    doc = _one_error_document(_invoke("devices", "setup", "--device", "local", "--venv", "~", "--json"), 2,
                              "UsageError", "--venv ~")
    exc = caught.value
    assert doc == error_document(type(exc).__name__, exc.message, exc.hint, exc.exit_code)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket is closed


def test_device_error_prints_the_document_and_the_plain_error(deploy_bundle_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bundle = deploy_bundle_factory(name="closed")
    spec = f"pi@127.0.0.1:{_closed_port()}"
    args = ("deploy", bundle, "--device", spec, "--known-hosts", tmp_path / "known_hosts")
    result = _invoke(*args, "--json")
    assert result.exit_code == 4, (result.stdout, result.stderr)
    doc = json.loads(result.stdout)
    (entry,) = doc["devices"]
    assert doc["passed"] is False and entry["ok"] is False and entry["error"]
    said = entry["error"] if entry["error"].startswith(f"{entry['device']}: ") else f"{entry['device']}: {entry['error']}"
    assert f"error: {said}" in result.stderr and f"{entry['device']}: {entry['device']}: " not in result.stderr
    plain = _invoke(*args)
    assert plain.exit_code == 4 and "FAILED" in plain.stdout and entry["error"] in plain.stderr
    assert api.deploy(bundle, devices=[spec], known_hosts=tmp_path / "known_hosts",
                      progress_stream=None).to_dict() == doc


def test_every_command_shows_its_help() -> None:
    for path in sorted(FRONT_DOOR):
        result = _invoke(*path, "--help")
        assert result.exit_code == 0, (path, result.stderr)
        assert result.stdout.startswith("Usage: ") and " ".join(path) in result.stdout.splitlines()[0], path
        assert "--json" in result.stdout, path
