"""The latency-throughput curve (--throughput): batch sizes, or requests in flight for a fixed batch.
"""
import time
from typing import Any  # noqa: F401
from .measuring import dequantize, in_manifest_order, latency_stats, prepare_input
from .models import Tensor

# --- shipped from here (the lines above are for the host's type checker) ---

DEFAULT_BATCH_SIZES = (1, 4, 8)


DEFAULT_IN_FLIGHT = (1, 2, 4)


def _stack_inputs(numpy, inputs, samples, batch):
    # type: (Any, list, list, int) -> list
    """[(Tensor, array)] holding ``batch`` golden samples (cycled) along the batch dimension."""
    pairs = []
    for tensor, golden in zip(inputs, samples):
        rows = [_prepare_sample(numpy, tensor, golden[i % len(golden)]) for i in range(batch)]
        pairs.append((tensor, numpy.ascontiguousarray(numpy.concatenate(rows, axis=0))))
    return pairs


def _prepare_sample(numpy, tensor, sample):
    # type: (Any, Tensor, Any) -> Any
    """One golden sample at batch 1 in the tensor's dtype (shape [1, ...] whatever the tensor's batch is)."""
    one = Tensor(tensor.name, [1] + list(tensor.shape[1:]), tensor.dtype, tensor.scale, tensor.zero_point,
                 tensor.key)
    array = prepare_input(numpy, one, sample)
    if array.ndim == len(one.shape) - 1:
        array = array[None]
    return array


def _point(batch, in_flight, seconds_per_call, total, wall):
    # type: (int, int, list, int, float) -> dict
    stats = latency_stats(seconds_per_call)
    return {"batch": batch, "in_flight": in_flight, "inferences_per_s": round(total / wall, 3) if wall > 0 else None,
            "latency_ms": {"p50": stats["p50"], "p90": stats["p90"], "mean": stats["mean"]},
            "calls": len(seconds_per_call)}


def measure_throughput(numpy, model, record, samples, opts, reopen):
    # type: (Any, Any, dict, list, Any, Any) -> dict
    """Inferences per second at the batch sizes the artifact allows: a dynamic batch dimension is run at each
    ``--batch-sizes`` value (and each sample's outputs compared with its batch-1 outputs); a fixed batch of 1
    is run with several requests in flight (one interpreter per request for TFLite, one shared session for ORT)."""
    inputs = in_manifest_order(model.inputs, record.get("inputs"))
    outputs = in_manifest_order(model.outputs, record.get("outputs"))
    if not samples or len(samples) != len(inputs):
        samples = [numpy.zeros([1] + [d if d > 0 else 1 for d in t.shape[1:]], "float32") for t in inputs]
        samples = [s[None] for s in samples]
    runs = max(5, getattr(opts, "throughput_runs", 0) or opts.runs)
    min_time = getattr(opts, "throughput_time", 0.0) or 0.0
    if model.dynamic_batch():
        sizes = sorted(set(getattr(opts, "batch_sizes", None) or DEFAULT_BATCH_SIZES))
        biggest = max(sizes)
        reference = []  # type: list
        for i in range(biggest):
            model.set_inputs([(t, _prepare_sample(numpy, t, g[i % len(g)])) for t, g in zip(inputs, samples)])
            got = dict((t.key, a) for t, a in zip(model.outputs, model.invoke()))
            reference.append([dequantize(numpy, t, got[t.key]) for t in outputs])
        step = max([t.scale for t in outputs if t.quantized] or [0.0])
        given = record.get("golden")
        golden = given if isinstance(given, dict) else {}
        tolerance = max(float(golden.get("atol") or 0.0), 1e-4) + step * 1.0001
        points = []
        matches = []
        for batch in sizes:
            model.resize_batch(batch)
            model.set_inputs(_stack_inputs(numpy, inputs, samples, batch))
            got = dict((t.key, a) for t, a in zip(model.outputs, model.invoke()))
            worst = 0.0
            for k, tensor in enumerate(outputs):
                out = dequantize(numpy, tensor, got[tensor.key])
                for i in range(batch):
                    want = reference[i][k].reshape(-1)
                    row = out[i].reshape(-1)
                    if row.size != want.size:
                        worst = float("inf")
                        continue
                    worst = max(worst, float(numpy.max(numpy.abs(row - want))) if want.size else 0.0)
            matches.append({"batch": batch, "max_abs_error": worst, "ok": worst <= tolerance})
            model.invoke()
            calls = model.timed_loop(max(5, runs // batch), min_time)
            points.append(_point(batch, 1, calls, batch * len(calls), sum(calls)))
        model.resize_batch(1)
        return {"mode": "batch", "points": points, "per_sample": {"tolerance": tolerance, "checks": matches,
                                                                  "ok": all(m["ok"] for m in matches)}}
    import threading

    levels = sorted(set(getattr(opts, "in_flight", None) or DEFAULT_IN_FLIGHT))
    first = [(t, _prepare_sample(numpy, t, g[0])) for t, g in zip(inputs, samples)]
    points = []
    for level in levels:
        workers = reopen(level)  # [(model, set_inputs done)] one per request in flight
        per_worker = max(3, runs // level)
        times = [[] for _ in workers]  # type: list
        spans = [None] * len(workers)  # type: list
        barrier = threading.Barrier(len(workers))
        errors = []  # type: list

        def work(slot, worker):
            # type: (int, Any) -> None
            try:
                worker.set_inputs([(_match(worker, t), a) for t, a in first])
                worker.invoke()
                barrier.wait()
                clock = time.perf_counter
                begin = clock()
                for _ in range(per_worker):
                    t0 = clock()
                    worker.invoke()
                    times[slot].append(clock() - t0)
                spans[slot] = (begin, clock())
            except Exception as exc:  # reported below, not lost in a thread
                errors.append(exc)
                try:
                    barrier.abort()
                except Exception:
                    pass

        threads = [threading.Thread(target=work, args=(i, w)) for i, w in enumerate(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        wall = max(s[1] for s in spans) - min(s[0] for s in spans)  # first request in to last one out
        flat = [t for ts in times for t in ts]
        points.append(_point(1, level, flat, len(flat), wall))
    return {"mode": "in_flight", "points": points, "per_sample": None}


def _match(worker, tensor):
    # type: (Any, Tensor) -> Tensor
    """The worker's own tensor with the name of ``tensor`` (each interpreter has its own tensor indices)."""
    for own in worker.inputs:
        if own.name == tensor.name:
            return own
    return tensor
