"""ExecuTorch's native runner (pte_runner.cpp) driven through a framed pipe: no torch in any process;
the bundled program read without a flatbuffers library.
"""
import json
import os
import subprocess
from typing import Any, Dict, Optional  # noqa: F401
from .base import REDEPLOY_HINT, RunnerError, signal_name
from .models import DEFAULT_PROFILE_RUNS, Tensor, import_numpy
from .pte import PTE_SCALAR_TYPES, PteBase

# --- shipped from here (the lines above are for the host's type checker) ---

# --- the native .pte runner (toolkit/device_side/pte_runner.cpp), driven through a framed pipe ---

PTE_NUMPY_CODES = dict((name, code) for code, name in PTE_SCALAR_TYPES.items())


PTE_ERROR_KINDS = {0x10: "unsupported_op", 0x11: "unsupported_op", 0x14: "unsupported_op", 0x30: "unsupported_op",
                   0x21: "crash", 0x25: "crash", 0x31: "crash"}  # ExecuTorch's Error codes; the rest: corrupt


class NativePte(object):
    """One native runner process holding one loaded program; requests and replies are frames on its pipes."""

    def __init__(self, binary, lib, path, threads, profile=False):
        # type: (str, str, str, int, bool) -> None
        import tempfile

        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        self.log = tempfile.TemporaryFile()  # ExecuTorch's own log lines; their tail names a failure
        argv = [binary, path, "forward", str(int(threads))] + (["profile"] if profile else [])
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env=env)
        if self.proc.stdin is None or self.proc.stdout is None:  # never with PIPE: said for the type checker
            raise RunnerError("crash", "The native .pte runner started without its pipes.")
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.hello = self.reply()

    def _died(self):
        # type: () -> RunnerError
        code = self.proc.wait()
        self.log.seek(0)
        tail = self.log.read().decode("utf-8", "replace").strip().splitlines()[-3:]
        how = "signal {}".format(signal_name(-code)) if code < 0 else "exit status {}".format(code)
        return RunnerError("crash", "The native .pte runner died ({}): {}".format(how, " | ".join(tail)[-600:]),
                           "Run the check again with --debug; a signal here is a crash inside ExecuTorch's "
                           "kernels or delegate.")

    def _read(self, size):
        # type: (int) -> bytes
        chunks, left = [], size
        while left:
            chunk = self.stdout.read(left)
            if not chunk:
                raise self._died()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def reply(self):
        # type: () -> tuple
        """(JSON document, raw tail) of the next reply; a failed reply raises RunnerError."""
        import struct

        size = struct.unpack("<I", self._read(4))[0]
        body = self._read(size)
        head = struct.unpack("<I", body[:4])[0]
        doc = json.loads(body[4:4 + head].decode("utf-8"))
        if not doc.get("ok"):
            self.log.seek(0)
            tail = self.log.read().decode("utf-8", "replace").strip().splitlines()[-2:]
            kind = PTE_ERROR_KINDS.get(doc.get("code"), "corrupt_artifact")
            raise RunnerError(kind, "executorch {}: {} (Error 0x{:x}){}".format(
                doc.get("executorch") or "", doc.get("error"), max(0, doc.get("code") or 0),
                ": " + " | ".join(tail)[-400:] if tail else ""),
                REDEPLOY_HINT if kind == "corrupt_artifact" else None)
        return doc, body[4 + head:]

    def request(self, op, payload=b""):
        # type: (bytes, bytes) -> tuple
        import struct

        try:
            self.stdin.write(struct.pack("<I", 1 + len(payload)) + op + payload)
            self.stdin.flush()
        except (IOError, OSError):
            raise self._died()
        return self.reply()

    def set_inputs(self, arrays):
        # type: (list) -> None
        """``arrays``: (ScalarType code, shape, raw bytes) per input, in the method's order."""
        import struct

        parts = [struct.pack("<I", len(arrays))]
        for code, shape, data in arrays:
            parts.append(struct.pack("<BB", code, len(shape)) + struct.pack("<{}q".format(len(shape)), *shape))
            parts.append(struct.pack("<Q", len(data)) + data)
        self.request(b"I", b"".join(parts))

    def run(self, numpy):
        # type: (Any) -> list
        doc, tail = self.request(b"R")
        outputs, at = [], 0
        for info in doc["tensors"]:
            dtype = numpy.dtype(PTE_SCALAR_TYPES.get(info["dtype"], "float32"))
            data = tail[at:at + info["nbytes"]]
            at += info["nbytes"]
            outputs.append(numpy.frombuffer(data, dtype).reshape(info["shape"]).copy())
        return outputs

    def timed(self, runs, min_time):
        # type: (int, float) -> list
        import struct

        doc, tail = self.request(b"T", struct.pack("<Id", int(runs), float(min_time)))
        return list(struct.unpack("<{}d".format(doc["count"]), tail))

    def close(self):
        # type: () -> None
        if self.proc.poll() is None:
            try:
                self.stdin.write(b"\x01\x00\x00\x00Q")
                self.stdin.close()
            except (IOError, OSError):
                pass
            self.proc.wait()


class NativePteModel(PteBase):
    """A .pte through the native runner: ExecuTorch's runtime libraries alone, no torch in any process. Its
    ``load_ms`` is the runner's own (program and method loaded, mmap data loader); ``peak_rss_mb`` the runner
    process's own peak, the program's memory rather than Python's."""

    def __init__(self, version, path, threads, runner, profile=False):
        # type: (Any, str, int, tuple, bool) -> None
        numpy = import_numpy()
        self.runtime = "executorch"
        self.version = version
        self.path = path
        self.threads = threads
        self.runner = runner
        self.process = NativePte(runner[0], runner[1], path, threads, profile)
        hello = self.process.hello[0]
        self.own_load_ms = hello.get("load_ms")
        self.inputs = [Tensor("input_{}".format(i), list(t["shape"]), numpy.dtype(PTE_SCALAR_TYPES.get(
            t["dtype"], "float32")), 0.0, 0, i) for i, t in enumerate(hello["inputs"])]
        self.outputs = [Tensor("output_{}".format(i), list(t["shape"]) if t else [], numpy.dtype(
            PTE_SCALAR_TYPES.get((t or {}).get("dtype"), "float32")), 0.0, 0, i)
            for i, t in enumerate(hello["outputs"])]
        self.backends = sorted(hello.get("backends") or [])
        self.extra = {"backends": self.backends, "path": "native",
                      "native": {"executorch": hello.get("executorch"), "binary": runner[0]}}

    def set_inputs(self, pairs):
        # type: (list) -> None
        numpy = import_numpy()
        arrays = [None] * len(self.inputs)  # type: list
        for tensor, array in pairs:
            array = numpy.ascontiguousarray(array)
            arrays[tensor.key] = (PTE_NUMPY_CODES[array.dtype.name], list(array.shape), array.tobytes())
        self.process.set_inputs(arrays)

    def invoke(self):
        # type: () -> list
        return self.process.run(import_numpy())

    def timed_loop(self, runs, min_time):
        # type: (int, float) -> list
        return self.process.timed(runs, min_time)

    def peak_rss_mb(self):
        # type: () -> Optional[float]
        return round(self.process.request(b"S")[0]["peak_rss_kb"] / 1024.0, 1)

    def bundled_check(self, bundle, record, name, atol):
        # type: (str, Dict[str, Any], str, float) -> Dict[str, Any]
        return native_bundled_check(self, bundle, record, name, atol)

    def etdump_profile(self, path, threads, first, top):
        # type: (str, int, list, int) -> Dict[str, Any]
        """ETDump's generator subclassed in the native runner, each profiled event summed by name."""
        ops = [{"name": op["name"], "calls": op["calls"], "total_ms": round(op["ns"] / 1e6, 4),
                "mean_ms": round(op["ns"] / 1e6 / op["calls"], 5)} for op in self.profile(first, DEFAULT_PROFILE_RUNS)
               if op["calls"] and not op["name"].startswith(("Method::", "Program::"))]  # the call, the load
        if not ops:
            return {"available": False, "error": "this ExecuTorch build reported no profiling events"}
        ops.sort(key=lambda e: -e["total_ms"])
        return {"available": True, "source": "etdump", "runs": DEFAULT_PROFILE_RUNS, "top": ops[:top]}

    def profile(self, first, runs):
        # type: (list, int) -> list
        """Per-operator times of ``runs`` calls in a second runner loaded with ETDump's event tracer."""
        traced = NativePte(self.runner[0], self.runner[1], self.path, self.threads, profile=True)
        try:
            model = object.__new__(NativePteModel)
            model.inputs, model.process = self.inputs, traced
            NativePteModel.set_inputs(model, first)
            for _ in range(runs):
                traced.run(import_numpy())
            return traced.request(b"P")[0]["ops"]
        finally:
            traced.close()


def read_bundled_program(data):
    # type: (bytes) -> tuple
    """A bundled program (``.bpte``, ExecuTorch's ``bundled_program_schema.fbs``, a flatbuffer) read with no
    flatbuffers library: (program bytes, [(inputs, expected outputs)] of the ``forward`` suite), each value a
    (ScalarType code, sizes, raw bytes) tensor."""
    import struct

    def u32(at):
        return struct.unpack_from("<I", data, at)[0]

    def field(table, index):  # the position of a table's field, None when absent
        vtable = table - struct.unpack_from("<i", data, table)[0]
        slot = 4 + 2 * index
        if slot >= struct.unpack_from("<H", data, vtable)[0]:
            return None
        offset = struct.unpack_from("<H", data, vtable + slot)[0]
        return table + offset if offset else None

    def ref(at):  # follow an offset to a table, vector or string
        return at + u32(at)

    def tables(table, index):
        at = field(table, index)
        if at is None:
            return []
        vector = ref(at)
        return [ref(vector + 4 + 4 * i) for i in range(u32(vector))]

    def raw(table, index, width=1):  # a vector of scalars ``width`` bytes each, as bytes
        at = field(table, index)
        if at is None:
            return b""
        vector = ref(at)
        return data[vector + 4:vector + 4 + width * u32(vector)]

    def tensor(value):  # Value { val_type: ubyte, val: ValueUnion }; ValueUnion 1 = Tensor
        kind = field(value, 0)
        if kind is None or struct.unpack_from("<B", data, kind)[0] != 1:
            raise ValueError("the bundled program holds a value that is not a tensor")
        table = ref(field(value, 1))
        code_at = field(table, 0)
        sizes = raw(table, 1, 4)
        return (struct.unpack_from("<b", data, code_at)[0] if code_at is not None else 0,
                list(struct.unpack("<{}i".format(len(sizes) // 4), sizes)), raw(table, 2))

    root = ref(0)
    cases = []
    for suite in tables(root, 1):
        name_at = field(suite, 0)
        name = data[ref(name_at) + 4:ref(name_at) + 4 + u32(ref(name_at))].decode() if name_at else ""
        if name == "forward":
            cases = [([tensor(v) for v in tables(case, 0)], [tensor(v) for v in tables(case, 1)])
                     for case in tables(suite, 1)]
    return raw(root, 2), cases


def native_bundled_check(model, bundle, record, name, atol):
    # type: (Any, str, dict, str, float) -> dict
    """The bundled program's cases run by the native runner, each output within ``atol`` of its expected one
    (what ExecuTorch's verifier does at rtol 0). The program it bundles is the artifact (same bytes) or, if not,
    run in a runner of its own."""
    import hashlib
    import tempfile

    numpy = import_numpy()
    with open(os.path.join(bundle, name), "rb") as handle:
        program, cases = read_bundled_program(handle.read())
    process, folder = model.process, None
    if hashlib.sha256(program).hexdigest() != record.get("sha256"):
        folder = tempfile.mkdtemp(prefix="edgetk-bpte-")
        with open(os.path.join(folder, "program.pte"), "wb") as out:
            out.write(program)
        process = NativePte(model.runner[0], model.runner[1], os.path.join(folder, "program.pte"), model.threads)
    failed = []  # type: list
    try:
        for index, (inputs, expected) in enumerate(cases):
            process.set_inputs(inputs)
            got = process.run(numpy)
            for actual, (code, sizes, data) in zip(got, expected):
                want = numpy.frombuffer(data, PTE_SCALAR_TYPES.get(code, "float32")).reshape(sizes)
                if actual.shape != want.shape or not numpy.all(
                        numpy.abs(actual.astype("float64") - want.astype("float64")) <= atol):
                    failed.append(index)
                    break
            else:
                if len(got) != len(expected):
                    failed.append(index)
    finally:
        if folder:
            process.close()
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    return {"ok": bool(cases) and not failed, "cases": len(cases), "failed": failed, "atol": atol, "file": name,
            "path": "native"}
