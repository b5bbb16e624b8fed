"""Simulated hardware: profiles turned into a fake NVML and fake sysfs and /dev trees that the NVIDIA
and TPU discovery run over unchanged, stand-ins for the driver's tools, a simulated NIC driver, and
injected health faults. Sits above the vendor packages it drives; production code never needs it."""
