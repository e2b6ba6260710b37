# Two commands: `make demo` (set up + run the main job against the simulator) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint lint-deploy image-test constraints protos readme clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/cuzk-supervisor sim --fresh --exit-after-run

# Four test processes per core (at most 8): most end-to-end tests wait on the simulator's scaled
# time, so fewer leave the cores idle (2 cores, pytest alone before the passes below: -n 4 328 s,
# -n 6 254 s, -n 8 229-234 s; with them, make test on a fresh clone 215-225 s); worksteal hands
# a finished worker the queued long tests of a busy one. The flakes that load brought out at -n 6 and -n 8 were fixed at their causes (the
# sim timeline's rounding, the step-down's status read, three tests' real-time margins).
TEST_WORKERS ?= $(shell n=$$(( $$(nproc) * 4 )); echo $$(( n > 8 ? 8 : n )))

# Bytecode kept for the tests: where PYTHONDONTWRITEBYTECODE is set (this machine and CI), every
# process the suite starts (hundreds of supervisors, daemons and managers) compiled the package
# from source again (18 % of the suite's CPU: 530 s -> 436 s), and every pytest worker rewrote
# the assertions of every test module again (7.0 s -> 2.4 s of collection per worker). Compiled
# once up front so the workers and processes starting together do not each compile it. The
# tests' assertion rewriting (pytest's own cached modules, which compileall does not write) is
# done once by a collection pass: on a fresh clone each of the 8 workers rewrote every test
# module itself, about 30 s of the run (pytest -n 8: 221-227 s on a fresh clone, 193 s after).
# mypy (6 s of one core) runs beside, its report after the tests'; either failing fails the target.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m compileall -q cuzk_supervisor tests bench
	@echo "mypy, beside: pytest --collect-only, then pytest -n $(TEST_WORKERS)"
	@typing=$$(mktemp); $(BIN)/mypy > "$$typing" 2>&1 & mypy=$$!; \
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest --collect-only -q > /dev/null 2>&1; \
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal \
		--durations=25; tests=$$?; \
	wait $$mypy; typed=$$?; echo "mypy:"; cat "$$typing"; rm -f "$$typing"; \
	exit $$(( tests != 0 ? tests : typed ))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

lint-deploy: $(STAMP)
	bash .ci/lint-deploy

readme: $(STAMP)
	$(BIN)/python -m cuzk_supervisor.cli.readme

protos: $(STAMP)
	$(BIN)/python -m cuzk_supervisor.proto.generate

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis

# Build the image and check it against running containers (deploy/image-test.sh): needs root;
# installs docker.io and starts a dockerd of its own where needed, stops it after; the deploy
# check runs the simulated manager from the venv.
image-test: $(STAMP)
	bash deploy/image-test.sh

# constraints.txt from pyproject.toml (the versions the image installs; needs PyPI).
constraints: $(STAMP)
	$(BIN)/python deploy/constraints.py
