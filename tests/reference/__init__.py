"""Independent oracles for the fast path: a numpy forward pass over the gguf package's reader and
dequantizers (numpy_forward.reference_logits). Nothing here imports llamacy."""
