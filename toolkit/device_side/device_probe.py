# mypy: ignore-errors
"""The device probe: what a device is and what state it is in, as one JSON document (stdlib only).

The one probe every stage uses: ``edgetk devices probe`` and the check reports (the block below is inlined into
the shipped runner, because a bundle ships the runner alone), ``edgetk devices setup`` (run as ``python -c
<this file>``), the deploy helper (the block inlined too) and, on the host,
``toolkit.model.platform.probe_local`` (this file loaded in-process). The host turns the document into a
``toolkit.model.platform.DevicePlatform`` and matches a target profile; names for arches and ARM cores live there,
not here: this file reports what the device says, raw.

Python >= 3.6 (vermin-checked), no numpy, imports nothing from toolkit.
"""
# --- begin device probe (inlined into the runner and the helper when they are assembled: toolkit.device_side) ---
import json
import os
import platform
import re
import struct
import sys


def probe_read(path, limit=65536):
    """The text of a small system file, or None when it cannot be read (no /proc, no permission)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except (OSError, IOError):
        return None


def probe_cpuinfo():
    """/proc/cpuinfo as {lower-case key: first value}: the one parser of that file."""
    info = {}
    for line in (probe_read("/proc/cpuinfo", 1 << 20) or "").splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key and key not in info:
            info[key] = value.strip()
    return info


def probe_glibc():
    """The C library's glibc version ("2.36"), None on musl or an unknown libc."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    except (AttributeError, ValueError, OSError, IndexError):
        libc, version = platform.libc_ver()
        return version if libc == "glibc" and version else None


def probe_basics():
    """The interpreter and machine facts that decide what can run here (cheap: no /proc reads)."""
    soabi = ""
    try:
        import sysconfig

        soabi = sysconfig.get_config_var("SOABI") or ""
    except ImportError:
        pass
    return {
        "arch": platform.machine(),
        "system": platform.system(),
        "pointer_bits": struct.calcsize("P") * 8,
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "abi": "cp" + soabi.split("-")[1] if soabi.startswith("cpython-") else None,
        "glibc": probe_glibc(),
        "executable": sys.executable,
        "home": os.path.expanduser("~"),
    }


def probe_cpu_freq(cpu):
    """(current MHz, max MHz, governor) of cpu0; /proc/cpuinfo's "cpu MHz" where cpufreq is absent."""
    base = "/sys/devices/system/cpu/cpu0/cpufreq"

    def mhz(name):
        try:
            return round(int((probe_read(os.path.join(base, name)) or "").strip()) / 1000.0, 1)
        except ValueError:
            return None

    current = mhz("scaling_cur_freq") or mhz("cpuinfo_cur_freq")
    governor = (probe_read(os.path.join(base, "scaling_governor")) or "").strip() or None
    if current is None:
        try:
            current = round(float(cpu.get("cpu mhz", "")), 1)
        except ValueError:
            current = None
    return current, mhz("cpuinfo_max_freq"), governor


def probe_temperature():
    """(hottest zone in degrees C or None, [{"zone", "type", "temp_c"}]) from /sys/class/thermal."""
    zones, temps = [], []
    base = "/sys/class/thermal"
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("thermal_zone"))
    except OSError:
        names = []
    for name in names:
        try:
            value = int((probe_read(os.path.join(base, name, "temp")) or "").strip())
        except ValueError:
            continue
        temp = round(value / 1000.0 if abs(value) > 1000 else float(value), 1)
        temps.append(temp)
        zones.append({"zone": name, "type": (probe_read(os.path.join(base, name, "type")) or "").strip() or None,
                      "temp_c": temp})
    return (max(temps) if temps else None), zones


def probe_os_name():
    for line in (probe_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return platform.system()


def probe_environment():
    """Everything: the basics, the CPU and board (raw, as the device names them), memory, disk, clocks, heat.

    ``cpu_model`` is cpuinfo's "model name" (x86, 32-bit ARM), else its "Hardware"/"cpu model" line;
    ``cpu_part`` the ARM "CPU part" code (0xd08 = Cortex-A72; the host names it); ``device_model`` the board
    (``/proc/device-tree/model``, else cpuinfo's "Model" line, which on x86 is only a number).
    """
    env = probe_basics()
    cpu = probe_cpuinfo()
    cpu_model = cpu.get("model name") or cpu.get("hardware") or cpu.get("cpu model") or None
    board = (probe_read("/proc/device-tree/model") or "").strip("\x00 \n")
    if not board and not cpu.get("model", "").isdigit():
        board = cpu.get("model", "")
    memory_mb = None
    match = re.search(r"MemTotal:\s+(\d+)\s+kB", probe_read("/proc/meminfo") or "")
    if match:
        memory_mb = int(match.group(1)) // 1024
    free_disk_mb = None
    try:
        st = os.statvfs(os.path.expanduser("~"))
        free_disk_mb = st.f_bavail * st.f_frsize // (1024 * 1024)
    except (OSError, AttributeError):
        pass
    freq, freq_max, governor = probe_cpu_freq(cpu)
    temp, zones = probe_temperature()
    env.update({
        "os": probe_os_name(),
        "kernel": platform.release(),
        "device_model": board or None,
        "cpu_model": cpu_model,
        "cpu_part": cpu.get("cpu part") or None,
        "cores": os.cpu_count(),
        "cpu_freq_mhz": freq,
        "cpu_freq_max_mhz": freq_max,
        "governor": governor,
        "temperature_c": temp,
        "thermal_zones": zones,
        "memory_mb": memory_mb,
        "free_disk_mb": free_disk_mb,
        # qemu-user shows the host's cpuinfo: an ARM kernel with an x86 CPU is an emulator
        "emulated": bool(env["arch"] in ("aarch64", "arm64", "armv7l", "armv6l", "armv8l") and cpu_model
                         and re.search(r"Intel|AMD|EPYC|Xeon|Ryzen", cpu_model)),
    })
    return env


def probe_module_present(module):
    """Whether ``module`` can be imported here, without importing it (find_spec)."""
    try:
        import importlib.util

        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
# --- end device probe ---


if __name__ == "__main__":
    doc = probe_environment()
    doc["ensurepip"] = probe_module_present("ensurepip")
    doc["numpy"] = probe_module_present("numpy")
    sys.stdout.write(json.dumps(doc) + "\n")
