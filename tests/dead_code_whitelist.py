"""What the dead-code check (vulture, tests/test_dead_code.py, configured in pyproject.toml's [tool.vulture])
cannot see being used: each name here is used, and the comment says by whom. vulture reads this file as
code that uses these names; it is never imported. A name that is really unused does not go here: remove it.
"""
# ruff: noqa
# mypy: ignore-errors

_ = object()

# Named in a string and imported on use: the route table (conversion/routes.py, "module:NAME") and the ONNX
# backends' float exports (conversion/onnx/backend.py).
KERAS, AS_IS, LITERT, EXECUTORCH, FROM_ONNX, FROM_TF, FROM_TORCH, FROM_TFLITE  # a Route's backend
prepare  # OnnxBackend("toolkit.conversion.onnx.prepare:prepare")

# Python and library protocols: called by the interpreter or the library, never by name.
__getattr__  # toolkit/__init__.py: the verbs, loaded from api/ on first use (PEP 562)
_.__signature__  # model/options.py: the signature click and inspect read
format_commands  # cli/__init__.py: click.Group's hook for the help's command list
__call__  # api/rollout.py RunOn: a Protocol's call signature (DeviceSelection.run_batch fits it)
exc_type  # __exit__(exc_type, exc, tb): the protocol's parameters
on_train_batch_end, logs  # optimization/training.py: a Keras Callback hook and its parameter
_no_driver_transactions, _begin  # store/engine.py: SQLAlchemy event listeners (@event.listens_for)
instance  # toolkit/compat/__init__.py Member.instance: read by tests/test_compat.py
PIN, MEMBERS  # toolkit/compat/*.py: the pin and the private members, read by tests/test_compat.py

# Click options: the function receives every option by name.
mender  # cli/export_cmd.py: --mender names the export's kind (the only one today)

# Record fields: written into the --json documents and files by to_dict()/asdict, read by users.
files_total, files_sent, files_reused, bytes_total, bytes_resumed, files_compressed, bytes_uncompressed  # push
previous_by  # delivery/push.py PushResult
pid  # model/answers.py Deployer: who installed a version, in `status --json`
p99  # model/device_records.py LatencyStats
max_error  # model/records.py: the tolerance a record was judged with
load_ms_min  # optimization/load_time.py
install_hint  # runtimes/spec.py RuntimeSpec: the runner's install hints (tests/test_provisioning.py compares)
succeeded  # api/results.py, devices/fleet.py: public API (docs/api.md)

# Vocabulary words: read from files, flags and device reports by value (StrEnum members).
QOPERATOR, NCHW, GPU, NPU, DSP, OS_ERROR, CUT, MISSING_RUNTIME, UNSUPPORTED_OP, CORRUPT_ARTIFACT, BAD_BUNDLE

# Settings written on third-party objects (the library reads them).
_.log_severity_level, _.graph_optimization_level, _.optimized_model_filepath  # onnxruntime SessionOptions
_.intra_op_num_threads, _.inter_op_num_threads  # onnxruntime SessionOptions
_.dim_param  # ONNX shape dimensions
_.optimizations, _.supported_types, _.representative_dataset, _.experimental_mlir_quantizer  # TFLiteConverter
_.supported_ops, _.signature_key  # TFLiteConverter target_spec; a SavedModel's serving signature
_.training  # torch modules put in eval mode
_.auth_timeout, _.banner_timeout, _.MAX_REQUEST_SIZE, _.seqno  # paramiko Transport, SFTP file, Message
_.exit_core_dumped  # devices/ssh_signal.py: the exit-signal request's field, recorded on the channel
_.isolation_level  # store/engine.py: the sqlite3 connection's (SQLAlchemy manages transactions)
_.edgetk_keepalive  # conversion/onnx/from_tf.py: the loaded model's variables kept alive by the traced function
_._program  # runtimes/execution/pte.py: the Program kept alive while its Method runs

# Documented API with no caller inside toolkit/ yet.
runtime_supports  # model/targets.py (docs/targets.md)

# Helpers kept for the tests (nothing in toolkit/ calls them): small views of live code, kept beside what they
# view; each could move into tests/ (left for now: those test files are being edited on other branches).
float_op_outputs  # runtimes/inspection/tflite.py: float_ops' names (tests/conversion/test_tflite.py)
runtimes_for  # runtimes/spec.py: the runtime table by format (tests/test_provisioning.py, the runner's tables)
rss_mb, reset_peak_rss  # optimization/memory.py: the memory tests' child processes measure with them
forget_engines  # store/engine.py: tests drop cached engines between databases (tests/test_store.py)
