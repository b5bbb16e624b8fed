"""What comes in: Kopf's handlers, the operator's own claim watch, liveness, and which instance is active."""
