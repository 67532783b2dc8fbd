"""What a worker runs: weight loading, architectures on shared layers, the model runner and sampler."""
