"""Entry points: the commands (``dra-operator run``, ``simulate``, ``release-claims``) and the
wiring of the running operator."""
