"""Foundations every layer may use: the settings and log throttling."""
