"""The device side of deploy: installed once per device as ``~/.edgetk/helper/<sha256>.py`` and run (from a
compiled cache, see ``toolkit.delivery.deployment._BOOT``) as ``python -S -c BOOT SUBCOMMAND ARGS...``.

Python >= 3.6, stdlib only (it must work on a device with no numpy and on Jetson's Python 3.6). Arguments
arrive as separate argv words (the host quotes each one), so names are data, never shell. Every path is
relative to the home directory (the working directory of SSH sessions and of ``local``). It prints one JSON
object between frame markers (so that other text on stdout cannot be taken for it); exit 0 = done, 3 = a refusal the host turns into a plain message ({"kind", "error", ...}).

Layout (``.edgetk`` stands for the toolkit's home on the device, ``$EDGETK_HOME``: see ``BASE``):
``.edgetk/bundles/<name>/<version>/`` (files mirror the bundle), ``.edgetk/bundles/<name>/current`` ->
``<version>`` (switched with rename(2) over a fresh symlink: atomic), ``.edgetk/bundles/<name>/.history.json``
(installed versions, oldest first, with every file's sha256, so rollback can verify what it switches to),
``.edgetk/locks/<name>/`` (mkdir is atomic: the deploy lock). The lock records the device's boot id and its
holder: the first non-shell ancestor of the helper (the per-connection sshd or dropbear process over SSH, the
edgetk process on ``local``) with its start time from /proc, plus who asked (the controller's host and pid,
what and which version, for the waiting side's message). A lock is broken only when its holder is provably gone
(another boot id, or the same boot and that process dead or its pid reused), at once, so a re-run after a link
cut does not wait; never by its age, which a device clock that jumps (no RTC, NTP after boot) would fake; and on
request (``--break-lock``) for the stuck case.

Every bundle-relative path from the host is checked again here (no absolute paths, no ``..``, no symlinked
directories on the way), so even a hand-crafted listing cannot write outside ``.edgetk/bundles/<name>/``.

A push costs two helper runs (each a fresh Python on the device, so each one counts), three when the files go as
one framed stream (``receive``, on devices without SFTP): ``begin`` (refuse a
foreign arch, probe, take the lock, prepare) and ``finish`` (inflate compressed uploads, verify, switch, keep,
release the lock, in a ``finally``); a failed write calls ``abort`` (remove the partial version, release the
lock). ``begin`` records the files it found already in place with the right sha256 (and their stat) in the
lock directory, so ``finish`` hashes only what was uploaded and any file whose stat changed since. The single
steps (``info``, ``lock``, ``prepare``, ``inflate``, ``unlock``) stay for rollback, remove and older callers.
The host runs this file with ``python -S`` (no site packages: it needs none, and site start-up with many
``.pth`` files costs tens of milliseconds per run); ``zlib`` is imported only where used.

It is assembled on the host from blocks of one job each (toolkit/device_side/src/helper/, each after its ``# ---
block:`` line below, in that order): the answer and its frame, the layout on the device, durable writes, the lock,
what the device says of itself, the follower, the install steps, the push, the installed bundles, and the verbs
(``COMMANDS``). The probe (``probe_*``) is ``device_probe.py``'s block and ``sha256_file`` is ``shared.py``'s, each
inlined where its marker line stands.
"""
import json
import os
import shutil
import sys
import time

# --- device probe: device_probe.py's block, inlined here when assembled (toolkit.device_side) ---
# --- file hash: shared.py's block, inlined here when assembled (toolkit.device_side) ---


# --- block: helper/answer.py ---
# --- block: helper/layout.py ---
# --- block: helper/storage.py ---
# --- block: helper/locks.py ---
# --- block: helper/device.py ---
# --- block: helper/follow.py ---
# --- block: helper/install.py ---
# --- block: helper/push.py ---
# --- block: helper/bundles.py ---
# --- block: helper/cli.py ---


if __name__ == "__main__":
    main(sys.argv[1:])
