"""Compute kernels behind small, tensor-in tensor-out interfaces; each fast kernel ``foo`` has a torch ``foo_ref``."""
