"""The user's OpenSSH client configuration, read as ``ssh`` reads it, for one device.

``ssh`` reads ``~/.ssh/config`` then ``/etc/ssh/ssh_config``; for each option the first value obtained wins,
and ``Include`` (globs; relative paths under ``~/.ssh`` for the user's file, ``/etc/ssh`` for the system's)
reads other files at that point, inside the ``Host``/``Match`` block it appears in. paramiko's ``SSHConfig``
parses ``Host``/``Match`` blocks but leaves ``Include`` unexpanded, so it is expanded here first: each included
file's text is spliced in place, followed by the including block's own ``Host``/``Match`` line again, so that
what follows the ``Include`` is still in that block, as for ``ssh``.

Every option that applies to the device is then either **honoured** (:class:`SshOptions` carries it to
``toolkit.devices.ssh``), **not applicable** to edgetk's non-interactive sessions (forwarding, TTYs, control
sockets, log level...; docs/devices.md lists them), or **refused** with a :class:`~toolkit.errors.UsageError`
naming the option and the file: an option that would change where or how ``ssh`` connects is never silently
dropped. OpenSSH's own ``ssh -G HOST`` is the reference for what a file means, and the tests compare the two
option by option; it is not called at run time because it takes ``~`` from the passwd entry rather than
``$HOME``, runs ``Match exec`` commands, and is not installed on every host that runs edgetk.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UsageError

SYSTEM_CONFIG = Path("/etc/ssh/ssh_config")
MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH

HONOURED = frozenset({
    "host", "match", "hostname", "port", "user", "identityfile", "identitiesonly", "identityagent",
    "certificatefile", "proxyjump", "proxycommand", "userknownhostsfile", "globalknownhostsfile",
    "hostkeyalias", "connecttimeout", "serveraliveinterval", "serveralivecountmax", "hashknownhosts",
    "stricthostkeychecking", "pubkeyauthentication", "batchmode", "tcpkeepalive",
})
# Options about interactive sessions, forwarding, local conveniences or logging: they do not change which
# device edgetk reaches nor how it proves who either side is. Key exchange, cipher and MAC lists are left to
# paramiko's own (modern) preference order.
NOT_APPLICABLE = frozenset({
    "addkeystoagent", "usekeychain", "controlmaster", "controlpath", "controlpersist", "forwardagent",
    "forwardx11", "forwardx11trusted", "forwardx11timeout", "localforward", "remoteforward", "dynamicforward",
    "clearallforwardings", "exitonforwardfailure", "gatewayports", "requesttty", "sendenv", "setenv",
    "loglevel", "logverbose", "escapechar", "visualhostkey", "compression", "permitlocalcommand",
    "localcommand", "updatehostkeys", "checkhostip", "verifyhostkeydns", "nohostauthenticationforlocalhost",
    "connectionattempts", "ipqos", "streamlocalbindmask", "streamlocalbindunlink", "fingerprinthash",
    "hostbasedauthentication", "enablesshkeysign", "xauthlocation", "ignoreunknown", "stdinnull",
    "sessiontype", "forkafterauthentication", "canonicaldomains", "canonicalizefallbacklocal",
    "canonicalizemaxdots", "canonicalizepermittedcnames", "ciphers", "macs", "kexalgorithms",
    "hostkeyalgorithms", "pubkeyacceptedalgorithms", "pubkeyacceptedkeytypes", "hostbasedacceptedalgorithms",
    "casignaturealgorithms", "rekeylimit", "requiredrsasize", "obscurekeystroketiming", "tag", "protocol",
    "useprivilegedport", "addressfamily", "passwordauthentication", "kbdinteractiveauthentication",
    "challengeresponseauthentication", "preferredauthentications", "numberofpasswordprompts",
    "gssapiauthentication", "gssapidelegatecredentials", "warnweakcrypto", "permitremoteopen",
    "enableescapecommandline", "kbdinteractivedevices", "channeltimeout", "refuseconnection",
})
_CANONICAL_OFF = ("no", "false", "none")


@dataclass(frozen=True)
class SshOptions:
    """How to reach one device, as the user's OpenSSH configuration says (explicit spec fields win)."""

    host: str  # what the user typed: the alias
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()  # in order, existing files only (as ssh, which skips missing ones)
    identities_only: bool = False
    identity_agent: str | None = None  # a socket path; None: no agent
    certificate_files: tuple[str, ...] = ()
    proxy_jump: str | None = None
    proxy_command: str | None = None
    user_known_hosts: tuple[Path, ...] = ()
    global_known_hosts: tuple[Path, ...] = ()
    host_key_alias: str | None = None
    connect_timeout: float | None = None
    server_alive_interval: float | None = None  # None: not set (edgetk's own watchdog default applies)
    server_alive_count_max: int | None = None
    hash_known_hosts: bool = False
    strict_host_key_checking: str = "yes"  # yes | accept-new (no/off are taken as accept-new: see ssh.py)
    default_identities: bool = True  # no IdentityFile given: ssh tries ~/.ssh/id_* (so do we)
    config_files: tuple[Path, ...] = ()  # the files read, for messages

    @property
    def host_key_name(self) -> str:
        """The name host keys are stored under: HostKeyAlias, else ``host`` or ``[host]:port``."""
        name = self.host_key_alias or self.hostname
        return name if self.port == 22 or self.host_key_alias else f"[{name}]:{self.port}"


def _unquote(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError:
        return value.split()


def _criteria(header: str) -> str | None:
    """A ``Host``/``Match`` line as ``Match`` criteria (None for the implicit top-level ``Host *``)."""
    keyword, _, rest = header.partition(" ")
    rest = rest.strip()
    if keyword.lower() == "match":
        return rest
    patterns = rest.split()
    return None if patterns == ["*"] else "originalhost " + ",".join(patterns)


def expand_includes(path: Path, *, home: Path, user_config: bool, depth: int = 0,
                    context: str | None = None) -> tuple[str, list[Path]]:
    """The text of ``path`` with every ``Include`` replaced by the included files' text (see the module doc).

    ``context``: the criteria of the block the Include sits in. ssh never matches a ``Host``/``Match`` line of
    a file included from a block that does not apply, so each such line becomes a ``Match`` of both.
    """
    if depth > MAX_INCLUDE_DEPTH:
        raise UsageError(f"{path}: Include nested more than {MAX_INCLUDE_DEPTH} deep (a loop?).",
                         hint="Check the Include lines of your SSH configuration.")
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise UsageError(f"Cannot read the SSH configuration {path} ({exc.strerror or exc}).") from None
    base = home / ".ssh" if user_config else SYSTEM_CONFIG.parent
    out: list[str] = []
    read = [path]
    block = f"Match {context}" if context else "Host *"
    for line in text.splitlines():
        stripped = line.strip()
        parts = re.split(r"\s*=\s*|\s+", stripped, maxsplit=1)
        keyword = parts[0].lower() if parts else ""
        rest = parts[1] if len(parts) > 1 else ""
        if keyword in ("host", "match"):
            own = _criteria(f"{keyword} {rest}")
            inner_criteria = " ".join(c for c in (context, own) if c)
            block = f"Match {inner_criteria}" if inner_criteria else "Host *"
            out.append(block if context else line)
            continue
        if keyword != "include":
            out.append(line)
            continue
        for pattern in _unquote(rest):
            pattern = str(home) + pattern[1:] if pattern.startswith("~") else pattern
            full = pattern if os.path.isabs(pattern) else str(base / pattern)
            for name in sorted(glob.glob(full)):
                if not os.path.isfile(name):
                    continue
                inner, more = expand_includes(Path(name), home=home, user_config=user_config, depth=depth + 1,
                                              context=_criteria(block))
                out.append(inner)
                out.append(block)  # back in the including block, as ssh is after each included file
                read.extend(more)
    return "\n".join(out) + "\n", read


def _first(options: Mapping[str, object], key: str) -> str | None:
    value = options.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else str(value)


def _yes(value: str | None) -> bool:
    return (value or "").strip().lower() in ("yes", "true", "on")


def _expand(value: str, *, home: Path, hostname: str, user: str, port: int, alias: str) -> str:
    """``~`` and the %-tokens ssh expands in file options (%d home, %h host, %n alias, %p, %r user, %u, %%)."""
    if value.startswith("~"):
        value = str(home) + value[1:]
    tokens = {"d": str(home), "h": hostname, "n": alias, "p": str(port), "r": user, "u": _local_user(), "%": "%"}
    return re.sub(r"%(.)", lambda m: tokens.get(m.group(1), m.group(0)), value)


def _local_user() -> str:
    import getpass

    return os.environ.get("USER") or getpass.getuser()


def _number(options: Mapping[str, object], key: str, where: str) -> float | None:
    value = _first(options, key)
    if value is None or value.lower() == "none":
        return None
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"{where}: {key} {value!r} is not a number.", hint="Fix it in your SSH configuration.")\
            from None


def _read_options(host: str, home: Path, system_config: Path | None) -> tuple[dict[str, object], list[Path]]:
    """The options the user's and the system's configuration give ``host`` (Includes followed), and the files
    read. Values as paramiko gives them (a string, or a list for repeatable options)."""
    import paramiko

    texts: list[str] = []
    files: list[Path] = []
    user_config = home / ".ssh" / "config"
    if user_config.is_file():
        text, read = expand_includes(user_config, home=home, user_config=True)
        texts.append(text)
        files.extend(read)
    if system_config is not None and system_config.is_file():
        text, read = expand_includes(system_config, home=home, user_config=False)
        texts.append("Host *\n" + text)
        files.extend(read)
    if not texts:
        return {}, files
    try:
        return dict(paramiko.SSHConfig.from_text("\n".join(texts)).lookup(host)), files
    except Exception as exc:  # a broken ssh config is the user's to fix; say where
        raise UsageError(f"Cannot read the SSH configuration ({_where(files)}): {exc}.",
                         hint="Check it with: ssh -G " + shlex.quote(host)) from None


def _where(files: list[Path]) -> str:
    return ", ".join(str(f) for f in files[:3]) or "~/.ssh/config"


def _refuse_unfollowed(host: str, options: Mapping[str, object], where: str, proxy_jump: str | None) -> None:
    """Refuse an option edgetk cannot follow, by name (and ProxyCommand with ProxyJump)."""
    unsupported = sorted(k for k in options if k not in HONOURED and k not in NOT_APPLICABLE)
    canonical = _first(options, "canonicalizehostname")
    if canonical is not None and canonical.lower() in _CANONICAL_OFF:
        unsupported = [k for k in unsupported if k != "canonicalizehostname"]
    if _first(options, "pubkeyauthentication") is not None and not _yes(_first(options, "pubkeyauthentication")):
        unsupported.append("pubkeyauthentication")
    if unsupported:
        names = ", ".join(unsupported)
        raise UsageError(
            f"{host}: your SSH configuration ({where}) sets {names} for this host, which edgetk does not follow.",
            hint="edgetk logs in with keys, through ProxyJump/ProxyCommand when set; remove or scope that option "
            "(a Host block that does not match this device), or name the device as user@host:port.",
        )
    if options.get("proxycommand") and (proxy_jump or options.get("proxyjump")) and \
            str(options.get("proxyjump")).lower() != "none":
        raise UsageError(f"{host}: your SSH configuration ({where}) sets both ProxyCommand and ProxyJump.",
                         hint="Keep one of them for this host (ssh itself uses whichever comes first).")


def resolve(host: str, *, user: str | None = None, port: int | None = None, identity_file: str | None = None,
            proxy_jump: str | None = None, home: Path | None = None,
            system_config: Path | None = SYSTEM_CONFIG) -> SshOptions:
    """What ``ssh [-l user] [-p port] [-i identity_file] [-J proxy_jump] host`` would use, or a refusal."""
    home = home or Path.home()
    options, files = _read_options(host, home, system_config)
    where = _where(files)
    _refuse_unfollowed(host, options, where, proxy_jump)
    hostname = str(options.get("hostname") or host)
    port_value = port or int(_number(options, "port", where) or 22)
    login = user or _first(options, "user") or _local_user()

    def files_of(key: str) -> list[str]:
        values = options.get(key) or []
        values = values if isinstance(values, list) else [values]
        out = []
        for value in values:
            for item in _unquote(str(value)):
                out.append(_expand(item, home=home, hostname=hostname, user=login, port=port_value, alias=host))
        return out

    identities = ([os.path.expanduser(identity_file)] if identity_file else []) + files_of("identityfile")
    agent_value = _first(options, "identityagent")
    if agent_value is None or agent_value == "SSH_AUTH_SOCK":
        agent = os.environ.get("SSH_AUTH_SOCK") or None
    elif agent_value.lower() == "none":
        agent = None
    elif agent_value.startswith("$"):
        agent = os.environ.get(agent_value[1:]) or None
    else:
        agent = _expand(agent_value, home=home, hostname=hostname, user=login, port=port_value, alias=host)
    user_known = files_of("userknownhostsfile") or [str(home / ".ssh" / "known_hosts"),
                                                    str(home / ".ssh" / "known_hosts2")]
    global_known = files_of("globalknownhostsfile") or ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"]
    jump = proxy_jump if proxy_jump is not None else _first(options, "proxyjump")
    command = _first(options, "proxycommand")
    strict = (_first(options, "stricthostkeychecking") or "yes").lower()
    interval = _number(options, "serveraliveinterval", where)
    count = _number(options, "serveralivecountmax", where)
    timeout = _number(options, "connecttimeout", where)
    return SshOptions(
        host=host, hostname=hostname, port=port_value, user=login,
        identity_files=tuple(dict.fromkeys(p for p in identities if os.path.isfile(p))),
        identities_only=_yes(_first(options, "identitiesonly")), identity_agent=agent,
        certificate_files=tuple(p for p in files_of("certificatefile") if os.path.isfile(p)),
        proxy_jump=None if jump in (None, "", "none") else jump,
        proxy_command=None if not command or command.lower() == "none" else command,
        user_known_hosts=tuple(Path(p) for p in user_known if p.lower() != "none"),
        global_known_hosts=tuple(Path(p) for p in global_known if p.lower() != "none"),
        host_key_alias=_first(options, "hostkeyalias"),
        connect_timeout=timeout if timeout and timeout > 0 else None,
        server_alive_interval=interval if interval and interval > 0 else None,
        server_alive_count_max=int(count) if count and count > 0 else None,
        hash_known_hosts=_yes(_first(options, "hashknownhosts")),
        strict_host_key_checking="accept-new" if strict in ("accept-new", "no", "off", "false") else "yes",
        default_identities=not identities,
        config_files=tuple(files),
    )
