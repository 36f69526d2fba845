"""Every third-party private member edgetk touches (toolkit/compat/, one module per library) still exists in the
installed library, which is the version pyproject.toml pins: a new release that moves one fails here, naming
the pin and the member, before it fails somewhere deep in a conversion or an SSH session."""

from __future__ import annotations

import importlib
import inspect
import re
from importlib import metadata
from pathlib import Path

import pytest

from toolkit.compat import Member, executorch, keras, litert, paramiko, tensorflow, torch

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
MODULES = (paramiko, tensorflow, keras, litert, executorch, torch)


def _owner(member: Member) -> object:
    module, _, qualname = member.owner.partition(":")
    found: object = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        found = getattr(found, part)
    return found


def _has(owner: object, member: Member) -> bool:
    """Whether ``owner`` has the member: as an attribute of the module or class, or, for an attribute its
    instances get, written as one in the source of the class or its bases (``self.__x`` for a mangled name)."""
    if not member.instance:
        return hasattr(owner, member.name)
    assert isinstance(owner, type), member
    mangled = re.match(r"_([A-Za-z]\w*)__(\w+)$", member.name)
    written = f"__{mangled.group(2)}" if mangled else member.name
    for cls in owner.__mro__:
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if re.search(rf"\.{re.escape(written)}\s*(=|:)", source):
            return True
    return False


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_compat_module_names_the_pin_installed(module):
    name, version = module.PIN.split("==")
    assert f'"{module.PIN}"' in PYPROJECT.read_text(), f"{module.__name__}: {module.PIN} is not pyproject.toml's pin"
    installed = metadata.version(name).split("+")[0]  # a local label (torch's "+cpu") matches the pin (PEP 440)
    assert installed == version, (
        f"{name} {metadata.version(name)} is installed, but {module.__name__} was written against the pin "
        f"{module.PIN}: install the pin, or check every member in its MEMBERS against the new version")


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_private_member_exists_in_the_pinned_version(module):
    missing = [f"{m.owner}.{m.name}" for m in module.MEMBERS if not _has(_owner(m), m)]
    assert not missing, (
        f"{module.PIN} (pyproject.toml) no longer has {', '.join(missing)}: rewrite the functions of "
        f"{module.__name__} that use them for this version (or pin the one they were written for)")


def test_the_member_check_fails_for_a_member_that_moved():
    """The check itself: a renamed private member is reported, an attribute set in a constructor is found."""
    moved = Member("paramiko:Transport", "_cipher_info_renamed")
    assert not _has(_owner(moved), moved)
    assert not _has(_owner(Member("paramiko:Packetizer", "_Packetizer__gone", instance=True)),
                    Member("paramiko:Packetizer", "_Packetizer__gone", instance=True))
    present = Member("paramiko:Packetizer", "_Packetizer__write_lock", instance=True)
    assert _has(_owner(present), present)


def test_the_packetizer_fields_are_there_on_a_real_instance():
    """The ChaCha20 transport reads and writes these on a live Packetizer: check them on one."""
    import socket

    import paramiko as real

    left, right = socket.socketpair()
    try:
        packetizer = real.Packetizer(left)
        for field in paramiko.PACKETIZER_FIELDS:
            paramiko.set_packetizer_field(packetizer, field, paramiko.packetizer_field(packetizer, field))
    finally:
        left.close()
        right.close()
