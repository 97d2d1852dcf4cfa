# The book's two commands (see README):  make book   (build the HTML)   and   make test   (run all tests).
# Both create the virtual environment .venv and install requirements.txt into it on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROFILE ?= cpu
SCALE ?= full
CH ?= 01_paths
export PYTHONHASHSEED ?= 0
# byte code: pip installs without compiling (serial, every file of every package); Python compiles a module when
# it is first imported and keeps the result, so only what the book imports is compiled, once. Environments that
# set PYTHONDONTWRITEBYTECODE would otherwise compile torch & co. again in every process: not in make's commands
unexport PYTHONDONTWRITEBYTECODE
# pytest over the prepared chapters: nbval executes every cell once and compares the tagged ones
NBVAL := --nbval-lax --nbval-current-env --nbval-cell-timeout=1800 -p no:cacheprovider
# chapters and test files run WORKERS at a time (pytest-xdist; a chapter runs whole in one worker), each with
# WORKER_THREADS torch threads unless OMP_NUM_THREADS is set: one worker per core (WORKERS=1: one at a time)
WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
WORKER_THREADS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) / $(WORKERS) > 0 ? $$(nproc 2>/dev/null || echo 1) / $(WORKERS) : 1 )))
XDIST := $(if $(filter 0 1,$(WORKERS)),,-n $(WORKERS) --dist loadfile)
THREADS := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(WORKER_THREADS)}
# make html writes $(BOOK_OUT)/_build/html; make test puts the course build (HIDE_SOLUTIONS=1) into _build/course
BOOK_OUT ?= .
COURSE_HTML := _build/course/_build/html

.PHONY: env book notebooks html test portable unit smoke references sync student chapter sweep clean mutants robustness claims gpu-check

env: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -r requirements.txt
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (dualview)" > /dev/null
	touch $@

## make book: execute every chapter (cpu profile) once, then build the HTML into _build/html
## (a checked output that differs from its reference is reported and the book is still built; a failed cell stops it)
book: notebooks html

## execute the chapters with their claim checks (asserts) and reference-output checks; `notebooks.py report`
## lists the checked outputs that differ (exit 0: make book goes on) and the cells that failed (exit 1)
notebooks: env
	$(BIN)/python scripts/notebooks.py prepare --profile $(PROFILE)
	env $(THREADS) $(BIN)/python -m pytest $(NBVAL) $(XDIST) _build/nbtest; $(BIN)/python scripts/notebooks.py report

## build the HTML from the executed chapters, warnings as errors (HIDE_SOLUTIONS=1: a course build)
STAGE ?= _build/stage
html: env
	HIDE_SOLUTIONS=$(HIDE_SOLUTIONS) DUALVIEW_STAGE=$(STAGE) $(BIN)/python scripts/notebooks.py stage
	$(BIN)/jupyter-book build $(STAGE) --all --path-output $(BOOK_OUT) --warningiserror --nitpick --keep-going --quiet
	@echo "The book is in $(BOOK_OUT)/_build/html/index.html"

## (the two HTML builds, the book and the course, run side by side, each staged in its own folder)
## make test: unit and property tests, every chapter executed in the cpu profile (compared with its references)
## and at the smoke scale of the gpu profile (_build/smoke), the HTML build and its checks (tests/rendered).
## The chapters run under a CPU configuration other than the one the references were recorded with
## (`notebooks.py test-env` picks it, unless ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS or OMP_NUM_THREADS is set)
test: env
	$(BIN)/python scripts/notebooks.py check-sync
	$(BIN)/python scripts/student.py check
	$(BIN)/python scripts/notebooks.py prepare --profile cpu
	$(BIN)/python scripts/notebooks.py prepare --profile gpu --scale smoke
	cpu_env=$$($(BIN)/python scripts/notebooks.py test-env) && \
	env $(THREADS) $$cpu_env $(BIN)/python -m pytest tests --ignore=tests/rendered $(NBVAL) $(XDIST) \
		_build/nbtest _build/smoke \
		|| { $(BIN)/python scripts/notebooks.py report; exit 1; }
	$(MAKE) html & book=$$!; \
	$(MAKE) html HIDE_SOLUTIONS=1 BOOK_OUT=_build/course STAGE=_build/stage-course & course=$$!; \
	wait $$book; book=$$?; wait $$course; course=$$?; test $$book = 0 && test $$course = 0
	$(BIN)/python -m pytest -p no:cacheprovider tests/rendered
	HIDE_SOLUTIONS=1 DUALVIEW_HTML=$(COURSE_HTML) $(BIN)/python -m pytest -p no:cacheprovider tests/rendered/test_html.py

## the portable configuration: generic (non-vectorised) ATen kernels, SSE4.2 MKL, one thread. Slower than native
## kernels, and different from every machine's native configuration: `make references` records under it, so a
## native `make test` always compares the checked cells across configurations
PORTABLE_ENV ?= ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 OMP_NUM_THREADS=1

## the chapters (cpu profile) against the committed references under the portable configuration; no HTML
## (for references recorded natively with REFERENCE_ENV= , or to see what a reader's plain CPU computes)
portable: env
	$(BIN)/python scripts/notebooks.py prepare --profile cpu
	env $(PORTABLE_ENV) $(BIN)/python -m pytest $(NBVAL) $(XDIST) _build/nbtest

## the team's check before recording references: every cpu chapter executed again under SEED = 1 and SEED = 2
## (ROBUST_SEEDS), claims recorded but not raised, nothing compared; then the claims report of these runs and of
## the last book run (make test / make book): every claim that fails, or holds with margin < 1 half-width or
## without an interval, with chapter and cell (exit 1 if a claim fails in any run, or has margin < 1 or no
## interval in the book run: a margin below 1 under another seed is listed but allowed)
ROBUST_SEEDS ?= 1 2
robustness: env
	rm -rf _build/robust _build/robust-executed _build/claims/seed*
	for s in $(ROBUST_SEEDS); do $(BIN)/python scripts/notebooks.py prepare --profile cpu --seed $$s || exit 1; done
	env $(THREADS) DUALVIEW_CLAIMS_MODE=report $(BIN)/python -m pytest $(NBVAL) $(XDIST) _build/robust; \
		$(BIN)/python scripts/notebooks.py claims

## the claims report of the last runs alone (see robustness)
claims: env
	$(BIN)/python scripts/notebooks.py claims

unit: env
	env $(THREADS) $(BIN)/python -m pytest tests --ignore=tests/rendered $(XDIST)

## the gpu profile's code path in seconds: every chapter with PROFILE="gpu", SCALE="smoke" (nothing compared or kept)
smoke: env
	$(BIN)/python scripts/notebooks.py prepare --profile gpu --scale smoke
	env $(THREADS) $(BIN)/python -m pytest $(NBVAL) $(XDIST) _build/smoke

## make gpu-check: on a GPU machine, in at most 8 minutes, every chapter at the gpu profile's smoke scale on the GPU,
## a few timed steps of each chapter's paper-scale loops, one table in $(GPU_CHECK_OUT) (scripts/gpu_check.py);
## without a GPU the same code runs on the CPU at smoke scale (tests/test_gpu_check.py runs that path)
GPU_CHECK_OUT ?= _build/gpu-check
gpu-check: env
	$(BIN)/python scripts/gpu_check.py --out $(GPU_CHECK_OUT)

## mutation check: apply one-line mistakes to a copy of the library and report which the unit tests miss
mutants: env
	$(BIN)/python scripts/mutate.py

## re-record the reference outputs of the tagged cells and the CPU configuration they were recorded with
## (tests/reference/recorded-with.json; review the diff of tests/reference/ afterwards). They are recorded under
## the portable configuration (REFERENCE_ENV, default PORTABLE_ENV; `make references REFERENCE_ENV=` records natively)
REFERENCE_ENV ?= $(PORTABLE_ENV)
references: env
	$(BIN)/python scripts/notebooks.py prepare --profile cpu --record
	env $(REFERENCE_ENV) $(BIN)/python -m pytest $(NBVAL) $(XDIST) _build/nbtest
	env $(REFERENCE_ENV) $(BIN)/python scripts/notebooks.py record

## write the Colab copies book/*.ipynb and the student notebooks book/student/*.ipynb from the MyST sources book/*.md
sync: env
	$(BIN)/python scripts/notebooks.py sync
	$(BIN)/python scripts/student.py write

## write the student notebooks book/student/*.ipynb (the chapters without the solutions; commit them)
student: env
	$(BIN)/python scripts/student.py write

## run one chapter with papermill in a chosen profile (and scale):  make chapter CH=01_paths PROFILE=gpu [SCALE=smoke]
chapter: env
	mkdir -p _build/runs
	$(BIN)/jupytext --to ipynb --output _build/runs/$(CH).ipynb book/$(CH).md
	$(BIN)/papermill _build/runs/$(CH).ipynb _build/runs/$(CH)-$(PROFILE)-$(SCALE).ipynb -p PROFILE $(PROFILE) -p SCALE $(SCALE) --cwd book
	@echo "executed notebook: _build/runs/$(CH)-$(PROFILE)-$(SCALE).ipynb"

## fan a sweep out as submitit jobs, one JSON row each (README, "Paper-scale sweeps"):
##   make sweep SWEEP=fc4-mnist [CLUSTER=slurm] [PARALLEL=4] [SWEEP_ARGS="--partition gpu --gpus-per-node 1"]
##   make sweep SWEEP=chapter CH=05_dgn PROFILE=gpu SEEDS=5
SWEEP ?= digits
CLUSTER ?= local
PARALLEL ?= 2
SEEDS ?= 5
sweep: env
	$(BIN)/python scripts/sweep.py $(SWEEP) --cluster $(CLUSTER) --max-parallel $(PARALLEL) \
		--chapter $(CH) --profile $(PROFILE) --seeds $(SEEDS) $(SWEEP_ARGS)

clean:
	rm -rf _build
