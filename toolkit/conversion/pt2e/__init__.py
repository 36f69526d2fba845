"""The PT2E backend: PyTorch (torch.export) quantized with PT2E, and PyTorch -> TFLite through litert-torch; the
ExecuTorch backend builds on its quantization."""
