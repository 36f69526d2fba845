"""The convert stage. This folder holds the walk every route shares (``pipeline`` over ``plan``, ``candidate``,
the retries, ``write``); one package per format backend (``tflite``, ``onnx``, ``pt2e``, ``executorch``) builds
artifacts and answers what the walk asks of its format (``backend.Backend``); ``routes`` names each pair's
backend."""
