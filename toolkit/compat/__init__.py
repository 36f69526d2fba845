"""One module per third-party library for the private members of it that edgetk relies on.

A library's private member (``paramiko.Transport._cipher_info``, TensorFlow's ``_experimental_calibrate_only``, ...)
is not part of its contract: a new release may move it without notice. Every such use goes through this
package, one module per library, and each module's ``MEMBERS`` names every private member it touches;
``tests/test_compat.py`` checks each one against the installed, pinned version and names the pin when one has
moved. Nothing else in toolkit/ touches a third-party private name (``tests/test_private_names.py`` counts).

These modules import nothing from toolkit/ (floor 1) and import their library on first use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    """One private member: ``owner`` (``module`` or ``module:Class``) and its ``name``. ``instance``: an
    attribute an instance gets in its constructor (the test looks for it on a real instance or in the
    constructor's source), else one the module or class itself has."""

    owner: str
    name: str
    instance: bool = False
