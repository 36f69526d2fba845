"""eval and layers: the eval set and a layer probe through one artifact, on the device.
"""
import argparse
import json
import os
import re
import time
import traceback
from typing import Any  # noqa: F401
from .base import REDEPLOY_HINT, RUNNER_VERSION, RunnerError
from .environment import artifact_format, default_threads, find_record, on_demand_file, read_manifest, verify_artifact
from .measuring import in_manifest_order, load_npz, prepare_input
from .memory import available_memory_bytes
from .models import import_numpy, loaders_for, open_model

# --- shipped from here (the lines above are for the host's type checker) ---

EVAL_DIR = "eval"  # bundle folder of the eval set the host pushes for `check --eval`: input_<i>.npy


EVAL_MEMORY_SHARE = 0.25  # a chunk of eval inputs and outputs may take this share of the available memory


EVAL_MAX_CHUNK = 4096


def eval_chunk(sample_bytes, total, requested=None):
    # type: (int, int, Any) -> int
    """Samples per chunk: ``requested``, else what fits in a quarter of the available memory (inputs read from
    their memory-mapped files plus the outputs of the chunk), at least 1."""
    if requested:
        return max(1, min(int(requested), total))
    free = available_memory_bytes()
    if not free:
        return max(1, min(64, total))
    return max(1, min(total, EVAL_MAX_CHUNK, int(free * EVAL_MEMORY_SHARE) // max(1, sample_bytes)))


def _eval_inputs(numpy, bundle, manifest):
    # type: (Any, str, dict) -> list
    """The pushed eval inputs (``eval/input_<i>.npy`` as manifest.json records them), each checked against its
    sha256, memory-mapped."""
    found = [re.match(r"^" + EVAL_DIR + r"/input_(\d+)\.npy$", str(e.get("file")))
             for e in manifest.get("on_demand") or [] if isinstance(e, dict)]
    names = [m.group(0) for m in sorted((m for m in found if m), key=lambda m: int(m.group(1)))]
    if not names:
        raise RunnerError("bad_bundle", "manifest.json in {} records no eval set (eval/input_<i>.npy).".format(
            bundle), "Convert with --device-eval N, then run `edgetk check --eval` (it pushes the eval set).")
    paths = [on_demand_file(bundle, manifest, n) for n in names]
    try:
        return [numpy.load(p, mmap_mode="r", allow_pickle=False) for p in paths]
    except (OSError, IOError, ValueError) as exc:
        raise RunnerError("bad_bundle", "Cannot read the eval set ({}).".format(exc), REDEPLOY_HINT)


def _artifact_command(opts, what, body):
    # type: (argparse.Namespace, str, Any) -> dict
    """One artifact of the bundle, verified, handed to ``body(numpy, bundle, manifest, record, fmt, doc)``,
    which fills ``doc``; errors become the document's ``error``."""
    bundle = os.path.abspath(os.path.expanduser(opts.bundle))
    name = opts.artifact[0]
    doc = {"runner_version": RUNNER_VERSION, "ok": False, "artifact": name, "error": None}  # type: Any
    try:
        manifest = read_manifest(bundle)
        record = find_record(manifest, name)
        verify_artifact(bundle, record)
        body(import_numpy(), bundle, manifest, record, artifact_format(record), doc)
        doc["ok"] = doc["error"] is None
    except RunnerError as exc:
        doc["error"] = exc.to_dict()
    except Exception as exc:
        doc["error"] = RunnerError("crash", "{} {} failed ({}: {}).".format(
            what, name, type(exc).__name__, str(exc)[:300]), None,
            detail="".join(traceback.format_exc(limit=8))[-2000:]).to_dict()
    return doc


def run_eval(opts):
    # type: (argparse.Namespace) -> dict
    """Every eval sample through one artifact, in chunks sized to this device's memory; the raw outputs (in the
    artifact's own dtype: int8 outputs stay one byte a value) go to ``--out``/output_<k>.npy, their scale and
    zero point to the JSON, so the host dequantizes and scores them."""
    def body(numpy, bundle, manifest, record, fmt, doc):
        # type: (Any, str, dict, dict, str, dict) -> None
        name = record["file"]
        threads = opts.threads or default_threads(manifest, record)
        data = _eval_inputs(numpy, bundle, manifest)
        model = open_model(os.path.join(bundle, name), fmt, record, threads, opts.runtime)
        inputs = in_manifest_order(model.inputs, record.get("inputs"))
        outputs = in_manifest_order(model.outputs, record.get("outputs"))
        if len(data) != len(inputs):
            raise RunnerError("bad_bundle", "The eval set has {} inputs; {} has {}.".format(
                len(data), name, len(inputs)), "Convert the bundle again.")
        total = min(len(d) for d in data)
        out_dir = os.path.abspath(os.path.expanduser(opts.out))
        if not os.path.isdir(out_dir):
            os.makedirs(out_dir)
        writers = []  # type: list
        per_sample = sum(int(d[0].nbytes) for d in data) if total else 0
        t0 = time.perf_counter()
        chunk = 0  # sized from the first sample's inputs and outputs
        chunks = 0
        start = 0
        while start < total:
            size = chunk or 1
            block = [numpy.array(d[start:start + size]) for d in data]  # one chunk in memory at a time
            chunks += 1
            for i in range(len(block[0])):
                model.set_inputs([(t, prepare_input(numpy, t, b[i])) for t, b in zip(inputs, block)])
                got = dict((t.key, a) for t, a in zip(model.outputs, model.invoke()))
                values = [numpy.asarray(got[t.key]) for t in outputs]
                if not writers:
                    per_sample += sum(int(v.nbytes) for v in values)
                    chunk = eval_chunk(per_sample, total, opts.chunk)
                    writers = [numpy.lib.format.open_memmap(
                        os.path.join(out_dir, "output_{}.npy".format(k)), mode="w+", dtype=v.dtype,
                        shape=(total,) + tuple(v.shape)) for k, v in enumerate(values)]
                for w, v in zip(writers, values):
                    w[start + i] = v
            start += size
        for w in writers:
            w.flush()
        doc.update({
            "samples": total, "chunk": chunk, "chunks": chunks,
            "seconds": round(time.perf_counter() - t0, 3),
            "runtime": {"name": model.runtime, "version": model.version},
            "outputs": [{"file": "output_{}.npy".format(k), "name": t.name, "dtype": str(numpy.dtype(t.dtype)),
                         "scale": t.scale if t.quantized else None,
                         "zero_point": t.zero_point if t.quantized else None} for k, t in enumerate(outputs)],
        })

    return _artifact_command(opts, "Evaluating", body)


def run_layers(opts):
    # type: (argparse.Namespace) -> dict
    """The golden samples through one artifact with its intermediate tensors exposed; the tensors of its layer
    probe (``layers/<artifact>.probe.json``, pushed by the host) go, dequantized to float16, to the ``--out``
    .npz as ``t_<j>``.

    ONNX: ``layers/<artifact>.debug.onnx`` is a copy of the artifact with those tensors added as graph outputs
    (written at convert time: the device needs no onnx package). Both are checked against manifest.json."""
    def body(numpy, bundle, manifest, record, fmt, doc):
        # type: (Any, str, dict, dict, str, dict) -> None
        name = record["file"]
        try:
            with open(on_demand_file(bundle, manifest, "layers/{}.probe.json".format(name))) as handle:
                wanted = [str(layer["tensor"]) for layer in json.load(handle)["layers"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise RunnerError("bad_bundle", "The layer probe of {} is malformed ({}).".format(name, exc),
                              "Convert the bundle again.")
        golden = load_npz(numpy, os.path.join(bundle, manifest.get("golden_inputs") or "golden/inputs.npz"),
                           "input_")
        samples = min([opts.samples] + [len(g) for g in golden])
        runtime, values = loaders_for(fmt)[0].layers(numpy, bundle, manifest, record, wanted, golden, samples,
                                                     opts.runtime)
        arrays = dict(("t_{}".format(j), numpy.stack(v).astype(numpy.float16)) for j, v in values.items()
                      if len(v) == samples and samples)
        out = os.path.abspath(os.path.expanduser(opts.out))
        if not os.path.isdir(os.path.dirname(out)):
            os.makedirs(os.path.dirname(out))
        with open(out, "wb") as handle:
            numpy.savez(handle, **arrays)
        doc.update({"samples": samples, "runtime": runtime,
                    "found": ["t_{}".format(j) in arrays for j in range(len(wanted))]})

    return _artifact_command(opts, "Reading the layers of", body)
