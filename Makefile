# Thin wrappers; the logic lives in kubeseer/ and hack/.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint unit e2e demo demo-chart bench control-plane prometheus clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Builds (or reuses) the real Kubernetes binaries; where Go is absent it says so and the
# end-to-end tests skip with that reason.
control-plane:
	bash hack/build-control-plane.sh --skip-without-go

# Prometheus, promtool and the PromQL parser the chart's tests use (hack/build-prometheus.sh).
prometheus:
	bash hack/build-prometheus.sh --skip-without-go

lint: $(STAMP)
	$(VENV)/bin/ruff check kubeseer tests bench
	$(VENV)/bin/ruff format --check kubeseer tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: $(STAMP)
	$(PY) -m pytest -m "not e2e" tests

e2e: $(STAMP) control-plane prometheus
	$(PY) -m pytest -m e2e tests

test: lint control-plane prometheus
	$(PY) -m pytest tests

demo: $(STAMP) control-plane
	$(VENV)/bin/kubeseer demo

# The demo installed with the Helm chart (charts/kubeseer; docs/install.md).
demo-chart: $(STAMP) control-plane
	$(VENV)/bin/kubeseer demo --chart

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
