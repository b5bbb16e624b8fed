"""Reporters: Events about claims and pods the operator does not allocate itself."""
