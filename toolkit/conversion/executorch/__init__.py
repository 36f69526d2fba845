"""The ExecuTorch backend: PyTorch -> ``.pte`` (XNNPACK-delegated) and its bundled program."""
