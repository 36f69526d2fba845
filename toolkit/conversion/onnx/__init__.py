"""The ONNX backend: one float ONNX export per source (tf2onnx, torch.onnx, tf2onnx's TFLite frontend, an ONNX
source prepared), every precision derived from it with onnxruntime's own tools, and what the convert walk knows
about an ``.onnx`` artifact (its nodes, its cuts, its layer tensors, its execution providers)."""
