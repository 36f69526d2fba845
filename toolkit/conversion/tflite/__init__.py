"""The TFLite backend: Keras/SavedModel -> TFLite through TensorFlow's converter, and what the convert walk knows
about a ``.tflite`` artifact (its op table, its cuts, its layer tensors, the runtimes that load it)."""
