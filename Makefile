# The two commands of the README: `make run` (set up, then the main job) and `make test`
# (set up, then lint, type-check and the tests). Both work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
# The venv is rebuilt when pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)

.PHONY: run test setup models browser lint typecheck pytest clean

run: models
	$(BIN)/heterofold run

test: models browser lint typecheck pytest

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel of torch first, pinned: anything looser pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	rm -f $(VENV)/.installed-*
	touch $@

models: setup
	$(BIN)/heterofold models pull all

# Debian packages the tests use: chromium for the dashboard's browser tests (driven through
# Playwright, never `playwright install`) and docker-compose to validate docker-compose.yml.
browser:
	@need=""; [ -x /usr/bin/chromium ] || need="$$need chromium"; \
	command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || need="$$need docker-compose"; \
	if [ -n "$$need" ]; then \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$need; \
	fi

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

# pytest exits 5 when it collects no tests: that is a failure here, never a pass.
pytest: setup browser
	$(PY) -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
