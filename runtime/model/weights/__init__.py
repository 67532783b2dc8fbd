"""Weights and loading: the GGUF container and its dequantization, safetensors, the loader, and the
quantization methods."""
