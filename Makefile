PYTHON ?= python3

.PHONY: install test gpu-test shim

install:
	$(PYTHON) -m pip install -q -e '.[test]'

test:
	$(PYTHON) -m pytest -q -p no:cacheprovider tests

shim:
	$(PYTHON) shim/build.py

# On the GPU machine: builds the shim there and runs every GPU check, logging under $$OUT.
gpu-test:
	bash scripts/gpu-test.sh
