"""NVIDIA GPUs: NVML discovery, and the tools prepare uses on them (time-slicing, MPS, dynamic MIG)
and the NVML health probe. Built on the vendor-neutral core; never imports another vendor."""
