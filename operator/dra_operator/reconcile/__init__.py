"""Reconcile logic behind the thin Kopf handlers: claims, DeviceClasses, slices."""
