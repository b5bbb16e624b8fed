"""Google TPUs: PCI/sysfs discovery, the worker identity of multi-host slices, and the presence
health probe. Built on the vendor-neutral core; never imports another vendor."""
