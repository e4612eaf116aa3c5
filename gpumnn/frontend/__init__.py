"""ONNX -> IR, once per model: import, checks, opsets, external data and graph optimisations."""
