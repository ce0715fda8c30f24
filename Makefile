# make demo   build the default image, train the bundled example on two nodes (compose)
# make test   everything the tests need (venv, image, compiled wheels), then the tests
# make test-tpu  the tpu image, then the tests that need it (skipped by `make test` without it)
# make test-mxnet  the cpu-mxnet image and a venv with its pins, then MXNet's tests (skipped by `make test` without them)
#
# Build settings come from the environment (see `python build.py build --help`):
# BUILD_BASE_IMAGES, BUILD_WHEELHOUSE, BUILD_CA_CERT, BUILD_PIP_INDEX_URL, BUILD_WITHOUT, ...

PYTHON   ?= python3
VENV     ?= .venv
VARIANT  ?= cpu
IMAGE    ?= distributed-training-framework:$(VARIANT)
WHEELS   := .wheels/$(VARIANT)
PY       := $(VENV)/bin/python
COMPOSE  ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo "$(VENV)/bin/docker-compose")
PYTEST_ARGS ?=

TPU_IMAGE ?= distributed-training-framework:tpu
MXNET_VARIANT ?= cpu-mxnet
MXNET_IMAGE   ?= distributed-training-framework:$(MXNET_VARIANT)
MXNET_VENV    ?= .venv-mxnet
MXNET_WHEELS  := .wheels/$(MXNET_VARIANT)

.PHONY: demo test test-tpu test-mxnet venv image frameworks mxnet-venv clean

venv: $(VENV)/.dev
$(VENV)/.dev: requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	# The image's per-interpreter progress hook (disttrain.pth there), for the host tests' processes.
	$(PY) tests/install_progress_hook.py
	touch $@

image: venv
	$(PY) build.py build $(VARIANT) --export-wheels $(WHEELS)

# The image's own pins and its compiled Horovod/mpi4py wheels, for the host tests.
frameworks: image
	$(PY) build.py render $(VARIANT) -o build >/dev/null
	$(PY) -m pip install -q $(if $(BUILD_WHEELHOUSE),--find-links $(BUILD_WHEELHOUSE)) -r build/$(VARIANT)/requirements/runtime.txt
	$(PY) -m pip install -q --no-deps -r build/$(VARIANT)/requirements/runtime-nodeps.txt
	$(PY) -m pip install -q --no-deps --force-reinstall $(WHEELS)/*.whl

# MXNet needs numpy < 1.24, which TensorFlow cannot share: its host tests run in a second
# venv with the cpu-mxnet image's pins and Horovod wheel. `make test` skips them without it.
mxnet-venv: venv
	$(PY) build.py build $(MXNET_VARIANT) --export-wheels $(MXNET_WHEELS)
	$(PY) build.py render $(MXNET_VARIANT) -o build >/dev/null
	$(PYTHON) -m venv $(MXNET_VENV)
	$(MXNET_VENV)/bin/python -m pip install -q $(if $(BUILD_WHEELHOUSE),--find-links $(BUILD_WHEELHOUSE)) -r build/$(MXNET_VARIANT)/requirements/runtime.txt
	$(MXNET_VENV)/bin/python -m pip install -q --no-deps --force-reinstall $(MXNET_WHEELS)/*.whl
	$(MXNET_VENV)/bin/python tests/install_progress_hook.py

test: frameworks
	TEST_IMAGE=$(IMAGE) TEST_VARIANT=$(VARIANT) PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

test-mxnet: mxnet-venv
	MXNET_TEST_IMAGE=$(MXNET_IMAGE) TEST_IMAGE=$(IMAGE) TEST_VARIANT=$(VARIANT) PATH="$(abspath $(VENV))/bin:$$PATH" \
	  $(PY) -m pytest $(PYTEST_ARGS) tests/e2e/test_mxnet_host.py tests/e2e/test_mxnet_containers.py

# The tpu image (~8 GB) and the tests that need it; `make test` skips those without it.
test-tpu: venv
	$(PY) build.py build tpu
	TPU_TEST_IMAGE=$(TPU_IMAGE) PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest $(PYTEST_ARGS) tests/e2e/test_tpu_image.py

demo: image
	IMAGE=$(IMAGE) TRAIN_ARGS="--steps 60" $(COMPOSE) -p demo -f compose/two-node.yml up --abort-on-container-exit --quiet-pull >/tmp/demo.log 2>&1; \
	  status=$$?; $(COMPOSE) -p demo -f compose/two-node.yml logs --no-color | grep -E "RESULT|RESUMED|entrypoint: (node|done)"; \
	  $(COMPOSE) -p demo -f compose/two-node.yml down -v >/dev/null 2>&1; exit $$status

clean:
	rm -rf build .wheels
