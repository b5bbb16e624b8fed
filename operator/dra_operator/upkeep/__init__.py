"""Upkeep: the driver's DeviceClasses kept in place and validated, and ResourceSlices of vanished
nodes removed."""
