# The verbs people type. Everything runs from the project's own virtual environment.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
#: The suite takes minutes; past this many seconds it is stopped and fails instead of hanging.
TEST_TIMEOUT ?= 2700

.PHONY: install test test-fast test-gvisor engine gvisor podman image ci-image proto sandbox-up sandbox-down bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[all]'
	touch $(STAMP)

# pytest with the arguments given, stopped and failed past TEST_TIMEOUT seconds.
pytest = timeout --foreground --kill-after=60 $(TEST_TIMEOUT) $(BIN)/python -m pytest -q $(1) || { status=$$?; \
	  [ $$status -ne 124 ] || echo "make $@: stopped after $(TEST_TIMEOUT) s (TEST_TIMEOUT)" >&2; exit $$status; }

## test: the whole suite, after building the images it runs (a fresh machine's debootstrap takes
## minutes) and installing what it uses: podman, and runsc for the Swarm cluster's gVisor node
test: install image ci-image podman gvisor
	@$(call pytest)

## test-gvisor: the attack corpus (tests/security) again, every sandbox under gVisor's runsc
test-gvisor: install gvisor
	@PROTOLINK_SANDBOX_RUNTIME=runsc $(call pytest,tests/security)

## test-fast: what needs neither an engine nor root (a few minutes)
test-fast: install
	$(BIN)/python -m pytest -q -m "not docker and not root"

## engine: install (Debian, root) and start a Docker Engine when none answers
engine:
	bash scripts/engine-up.sh

## gvisor: install runsc (Debian, root) and register it with the engine as the runtime "runsc"
gvisor: engine
	bash scripts/gvisor-up.sh

## podman: install Debian's podman (Debian, root), which runs the generated Kubernetes Pod in the tests
podman:
	bash scripts/podman-up.sh

## image: the offline base image (debootstrap) and the sandbox image (wheelhouse)
image: install engine
	bash scripts/build-images.sh

## ci-image: the CI image (`--image ci`): the sandbox image's server on a base with compilers, pip, Node.js, npm
ci-image: install engine
	bash scripts/build-images.sh ci

proto: install
	$(BIN)/python -m protolink.wire.protogen

## sandbox-up: build when needed and start the appliance; ROOTS="/abs/dir:rw /abs/other" (or PROTOLINK_SANDBOX_ROOTS),
## none for a default workspace; CHOWN_WRITABLE=1 hands a writable root the commands' uid cannot write to that uid;
## ALLOW="pypi.org:443 files.pythonhosted.org:443" gives its commands those hosts through the egress proxy;
## CA_FILE=/etc/ssl/certs/ca-certificates.crt makes them trust that bundle (a network that intercepts TLS);
## it also starts the sandbox service (docs/service.md): POOL=N warm sandboxes, SERVICE_CONFIG=FILE its templates
sandbox-up: install engine
	$(BIN)/protolink-sandbox up $(foreach root,$(ROOTS),--root $(root)) $(if $(CHOWN_WRITABLE),--chown-writable) \
		$(foreach rule,$(ALLOW),--allow=$(rule)) $(if $(CA_FILE),--ca-file $(CA_FILE)) $(if $(POOL),--pool $(POOL)) \
		$(if $(SERVICE_CONFIG),--service-config $(SERVICE_CONFIG))

sandbox-down: install
	$(BIN)/protolink-sandbox down

## bench: every benchmark, one after another (figures are ratios printed side by side)
bench: install image ci-image
	for script in bench/process.py bench/search.py bench/documents.py bench/sandbox.py bench/transfer.py bench/cli.py bench/egress.py bench/ci.py; do \
		$(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
