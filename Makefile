# The README's commands (demo, test, image). Everything else is plain tox or the console scripts.
PYTHON ?= python3
VENV := .venv

.PHONY: demo test image venv clean
# The machine is checked before the venv or any build, so the order of prerequisites matters.
.NOTPARALLEL:

# Python, Go, root, disk, then the Debian packages (installed when root): one line and exit 1 on
# what is missing, seconds into the command rather than after minutes of building.
prereqs-%:
	@$(PYTHON) devcluster/dra_devcluster/prerequisites.py $*

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]' 'tox>=4.20'
	touch $@

venv: $(VENV)/.installed

demo: prereqs-demo venv
	$(VENV)/bin/dra-local-cluster demo $(DEMO_ARGS)

# The product image as an OCI archive in dist/ (mmdebstrap, no Docker daemon, no registry).
image: prereqs-image venv
	$(VENV)/bin/dra-local-cluster image --out dist

test: prereqs-test venv
	$(VENV)/bin/tox run -e lint,types,tests,e2e,oldest

clean:
	rm -rf $(VENV) .tox .mypy_cache .ruff_cache
