"""``python -m benchmarks [SECTION...]``: run all sections (or the named ones) and rewrite those sections of
docs/benchmarks.md, plus the machine description and the headline summary (docs/benchmarks.json keeps each
section's headline figures so that running one section keeps the others')."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import DOC, log, machine, table, update_doc

SECTIONS = ("convert", "int8", "convert_time", "torch_routes", "deploy", "runner", "loads", "optimize", "startup",
            "finetune_memory", "fleet", "selective", "selection", "crash_guard", "pte", "pte_native", "fail_fast")
HEADLINES = DOC.with_suffix(".json")


@contextlib.contextmanager
def _locked(doc: Path) -> Iterator[None]:
    """Hold an exclusive lock beside the doc while its sections and headlines are read and rewritten, so that
    two runs of different sections at once never interleave their read-modify-write."""
    lock = doc.parent / ".benchmarks.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_headlines(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def record(name: str, markdown: str, headline: dict[str, Any] | None, *, doc: Path = DOC,
           headlines_path: Path | None = None) -> dict[str, Any]:
    """Merge one section's result into docs/benchmarks.json and docs/benchmarks.md: the files are read again
    now (not at the start of the run), only this section's entry and block are replaced (``headline`` None
    keeps the entry it had: a failed run leaves the last figures), and the summary is rebuilt from the merged
    headlines. Returns the merged headlines."""
    path = headlines_path or doc.with_suffix(".json")
    with _locked(doc):
        headlines = _read_headlines(path)
        if headline is not None:
            headlines[name] = headline
        path.write_text(json.dumps(headlines, indent=1, sort_keys=True, default=float) + "\n")
        update_doc({name: markdown, "summary": summary(headlines)}, ["summary", *SECTIONS], doc=doc)
    return headlines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__)
    parser.add_argument("sections", nargs="*", metavar="SECTION", help=f"any of {', '.join(SECTIONS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; pick from {', '.join(SECTIONS)}")
    chosen = [s for s in SECTIONS if s in (args.sections or SECTIONS)]
    failed = []
    for name in chosen:
        log(f"=== section {name}")
        started = time.perf_counter()
        load_before = _loadavg()
        module = importlib.import_module(f"benchmarks.{name}")
        headline: dict[str, Any] | None
        try:
            markdown, headline = module.run()
        except Exception:  # noqa: BLE001 - one failing section must not lose the others' figures
            failed.append(name)
            text = traceback.format_exc()
            log(f"section {name} failed:\n{text}")
            markdown = f"## {module.TITLE}\n\nThis run failed:\n\n```\n{text[-3000:]}\n```"
            headline = None  # keep the figures of the last run that worked
        elapsed = time.perf_counter() - started
        if headline is not None:
            info = machine()
            headline = {**headline, "measured_on": (
                f"{time.strftime('%Y-%m-%d')}, {info['CPU']} ({info['CPU flags that matter here']}), load average "
                f"{load_before.split()[0]} -> {_loadavg().split()[0]}")}
        markdown += (f"\n\n_Section run time: {elapsed:.0f} s; load average (1, 5, 15 min) {load_before} at the "
                     f"start, {_loadavg()} at the end, on {machine()['CPU']} ({machine()['cores (os.cpu_count)']} "
                     "cores)._")
        record(name, markdown, headline, headlines_path=HEADLINES)
        log(f"section {name} done in {elapsed:.0f} s")
    return 1 if failed else 0


def _loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _fmt(value: object, suffix: str = "x") -> str:
    if value is None:  # a plain path that failed has no figure
        return "fails"
    if not isinstance(value, (int, float)) or math.isnan(value):
        return "n/a"
    return f"{value:.2f}{suffix}"


def summary(h: dict) -> str:
    """The headline table (the figures the README quotes)."""
    rows = []
    conv = h.get("convert", {}).get("mobilenetv2", {}).get("ratios", {})
    if conv:
        plain_ort = min((v for k, v in conv.items() if k.startswith("onnxruntime:") and "(plain)" in k
                         and "fp32" not in k), default=float("nan"))
        rows.append(["MobileNetV2 INT8 latency vs fp32, ONNX Runtime (target <= 0.45x)",
                     _fmt(conv.get("onnxruntime:toolkit int8")), f"best plain path {_fmt(plain_ort)}"])
        rows.append(["MobileNetV2 INT8 latency vs fp32, LiteRT (target <= 0.45x)",
                     _fmt(conv.get("litert:toolkit int8")),
                     f"plain Optimize.DEFAULT {_fmt(conv.get('litert:TFLiteConverter Optimize.DEFAULT (plain)'))}"])
    i8 = h.get("int8", {})
    if i8:
        gemm = i8.get("gemm_int8_vs_fp32", {})
        rows.append(["INT8 GEMM ceiling vs fp32 on this CPU (ONNX Runtime / LiteRT)",
                     f"{_fmt(gemm.get('onnxruntime'))} / {_fmt(gemm.get('litert'))}",
                     "VNNI" if i8.get("vnni") else "no VNNI (AVX2 int8)"])
        rows.append(["MobileNetV2 toolkit INT8 recipe vs fp32, side by side (ONNX Runtime / LiteRT; target <= 0.45x)",
                     f"{_fmt(i8.get('toolkit_ort'))} / {_fmt(i8.get('toolkit_litert'))}", "section int8"])
        a16w8 = i8.get("a16w8", {})
        if a16w8:
            rows.append(["MobileNetV2 A16W8 recipe (accuracy fallback) vs fp32 latency (ONNX Runtime / LiteRT)",
                         f"{_fmt(a16w8.get('onnxruntime'))} / {_fmt(a16w8.get('litert'))}", "section int8"])
    ct = h.get("convert_time", {})
    if ct:
        rows.append(["MobileNetV2 `edgetk convert` (profile's recipes, verified) vs the plain paths, wall time "
                     "(target <= 2x)", _fmt(ct.get("ratio")),
                     f"{_fmt(ct.get('toolkit_s'), ' s')} vs {_fmt(ct.get('plain_s'), ' s')}"])
    ld = h.get("loads", {})
    for key, value in ld.get("headline", {}).items():
        rows.append([key, str(value), "section loads"])
    pp = h.get("convert", {}).get("ppocr", {}).get("ratios", {})
    if pp:
        rows.append(["PP-OCRv4 det INT8 latency vs fp32, ONNX Runtime", _fmt(pp.get("onnxruntime:toolkit int8")),
                     (f"plain quantize_static {_fmt(pp.get('onnxruntime:quantize_static defaults (plain)'))}, "
                     f"quantize_dynamic {_fmt(pp.get('onnxruntime:quantize_dynamic (plain)'))}")])
    tr = h.get("torch_routes", {})
    for model, ratios in tr.get("ratios", {}).items():
        rows.append([f"PyTorch {model} INT8 ONNX latency vs fp32", _fmt(ratios.get("toolkit int8 onnx")),
                     f"plain export + quantize_dynamic {_fmt(ratios.get('plain quantize_dynamic'))}"])
        if "toolkit int8 tflite" in ratios:
            rows.append([f"PyTorch {model} INT8 TFLite (litert-torch) latency vs fp32",
                         _fmt(ratios["toolkit int8 tflite"]), ""])
    for key, value in h.get("pte", {}).get("int8_vs_fp32", {}).items():
        rows.append([f"PyTorch {key}: INT8 latency vs fp32", _fmt(value), "section pte"])
    dp = h.get("deploy", {})
    if dp:
        rows.append(["Push 50 MB over SSH vs the faster of SFTP/scp (target >= 0.8x)", _fmt(dp.get("push_vs_best")),
                     f"{_fmt(dp.get('push_mb_s'), ' MB/s')} vs {_fmt(dp.get('best_mb_s'), ' MB/s')}"])
        for size in (2, 50):
            if f"dropbear_{size}mb_push_vs_ssh_cat" in dp:
                rows.append([f"Push {size} MB to Dropbear (no SFTP) vs `ssh cat` (speed, target >= 0.8x)",
                             _fmt(dp.get(f"dropbear_{size}mb_push_vs_ssh_cat")),
                             f"OpenSSH push vs scp: {_fmt(dp.get(f'openssh_{size}mb_push_vs_scp'))}"])
        rows.append(["8 devices in parallel vs one after another (wall time)", _fmt(dp.get("fleet_ratio")),
                     f"{_fmt(dp.get('parallel_s'), ' s')} vs {_fmt(dp.get('serial_s'), ' s')}"])
    rn = h.get("runner", {}).get("ratios", {})
    medians = [v for k, v in rn.items() if "fastest" not in k]
    fastest = [v for k, v in rn.items() if "fastest" in k]
    if medians:
        rows.append([f"Runner p50 vs a bare loop, {len(medians)} MobileNetV2 artifacts (target within 5%)",
                     f"{_fmt(min(medians))} to {_fmt(max(medians))}",
                     (f"fastest rounds {_fmt(min(fastest, default=float('nan')))} to "
                     f"{_fmt(max(fastest, default=float('nan')))}")])
    st = h.get("startup", {})
    if st:
        rows.append(["`edgetk --help` vs `python -c 'import click'` (target <= 2x)", _fmt(st.get("help_vs_click")),
                     f"{_fmt(st.get('help_ms'), ' ms')} vs {_fmt(st.get('click_ms'), ' ms')}"])
    op = h.get("optimize", {})
    for key, value in op.get("headline", {}).items():
        rows.append([key, str(value), ""])
    for key, value in h.get("finetune_memory", {}).get("headline", {}).items():
        rows.append([key, str(value), ""])
    sel = h.get("selective", {})
    for key, route in (("resnet50_keras_tflite", "Keras"), ("resnet50_torch_tflite", "PyTorch")):
        if sel.get(f"{key}_s") is not None:
            rows.append([f"ResNet50 selective quantization, {route} -> TFLite, wall time (target < 180 s on 2 cores)",
                         _fmt(sel.get(f"{key}_s"), " s"),
                         f"{_fmt(sel.get(f'{key}_cpu_s'), ' s')} CPU; section selective"])
    ff = h.get("fail_fast", {})
    if ff:
        rows.append(["Small CNN whose INT8 cannot pass, TFLite + ONNX + .pte: `edgetk convert` vs the plain paths "
                     "(target <= 2x)", _fmt(ff.get("ratio")),
                     f"{_fmt(ff.get('toolkit_s'), ' s')} vs {_fmt(ff.get('plain_s'), ' s')}; without fail fast "
                     + (f"over {_fmt(ff['unweighed_ratio_over'])}" if "unweighed_ratio_over" in ff
                        else _fmt(ff.get("unweighed_ratio")))])
    sn = h.get("selection", {})
    for slug, entry in sn.get("models", {}).items():
        ratios = list((entry.get("selected_vs_old") or {}).values())
        rows.append([f"{slug}: p50 of the artifact `local` selected vs the old preference (issue 23)",
                     f"{_fmt(min(ratios, default=float('nan')))} to {_fmt(max(ratios, default=float('nan')))}",
                     f"selected {entry.get('selected')}; section selection"])
    if sn.get("stability"):
        st2 = sn["stability"]
        rows.append([f"Distinct preferred artifacts in 10 generic-x86_64 conversions under {st2.get('hogs')} CPU hogs "
                     "(target 1)", str(st2.get("new_distinct")), f"old rule: {st2.get('old_distinct')}"])
    if not rows:
        return "## Headline figures\n\nNo section has run yet."
    measured = [f"- {name}: {h[name].get('measured_on', 'an earlier run (before sections recorded their machine)')}"
                for name in SECTIONS if isinstance(h.get(name), dict) and h[name]]
    return ("## Headline figures\n\n" + table(["what", "measured", "compared with"], rows)
            + "\n\nEach section's figures come from its own last run:\n\n" + "\n".join(measured))


if __name__ == "__main__":
    sys.exit(main())
