# The README's commands (demo, test, image). Everything else is plain tox or the console scripts.
PYTHON ?= python3
VENV := .venv

.PHONY: demo test image venv clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]' 'tox>=4.20'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/dra-local-cluster demo $(DEMO_ARGS)

# The product image as an OCI archive in dist/ (mmdebstrap, no Docker daemon, no registry).
image: venv
	$(VENV)/bin/dra-local-cluster image --out dist

test: venv
	$(VENV)/bin/tox run -e lint,types,tests,e2e

clean:
	rm -rf $(VENV) .tox .mypy_cache .ruff_cache
