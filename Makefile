# mnist-scale-lab: two commands do all set-up.
#   make lab    create .venv, install, provision MNIST, start JupyterLab on notebooks/
#   make test   same set-up, then every test: units, each notebook once (quick profile), the AVX2 profile, Slurm and
#               the browser test. As root it apt-gets Chromium and Slurm first; MNIST_NO_SYSTEM_INSTALL=1 opts out
#               (those tests then skip with the reason)
#   make check  the contributor's inner loop: every test that starts no process, kernel, server or browser (minutes)
# Override the interpreter with `make PYTHON=python3.12 ...`, the torch build with
# `make TORCH_SPEC="torch torchvision" ...` (e.g. to let pip pick a build for your CUDA).
# Without an NVIDIA GPU the CPU-only torch is installed (scripts/torch_source.py says which and why, in one line),
# unless the pinned torch already lies on this machine's disk; MNIST_TORCH_SOURCE=pinned turns the choice off.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
# The versions the series is tested with; on the lab machines pip takes them from local disk.
TORCH_SPEC  ?= torch==2.14.1 torchvision==0.29.1
DATA_ROOT   ?= data
NB_TIMEOUT  ?= 900
# whole-notebook limit (pytest-timeout; pyproject's 600 s is per unit test): quick notebooks take 1-6 min
NB_TOTAL    ?= 1800
# `make full NB=10`: notebook(s) matching notebooks/NB*.ipynb in the full profile, outputs kept in the file
NB          ?= [0-9]
STAMP       := $(VENV)/.installed
# `make lab LAB_ARGS="--ip=0.0.0.0 --no-browser"`: extra flags for jupyter lab (a container, a remote machine,
# --port=N). As root (a container, a fresh cloud machine) lab adds --allow-root, which jupyter demands there.
LAB_ARGS    ?=
# the folder JupyterLab opens (the widget test points it at a scratch folder)
LAB_DIR     ?= notebooks
LAB_ROOT     = $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab test check test-avx2 avx2-tests unit notebooks browser slurm full data install clean distclean strip exercises saved claims \
        diagrams tables

$(PY):
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "mnist-scale-lab needs Python >= 3.10, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install $$($(PY) scripts/torch_source.py $(TORCH_SPEC))
	$(PY) -m pip install -e '.[dev]'
	$(PY) -m mnist_helpers.course.env_check --quiet
	touch $(STAMP)

install: $(STAMP)

data: install
	$(PY) -m mnist_helpers.data --root $(DATA_ROOT)

lab: data
	$(if $(LAB_ROOT),@echo "make lab: you are root (uid 0) so JupyterLab gets --allow-root")
	$(VENV)/bin/jupyter lab --notebook-dir=$(LAB_DIR) $(LAB_ROOT) $(LAB_ARGS)

# Debian's Chromium for tests/system/test_jupyterlab.py (does nothing when present; the browser test skips where it cannot install)
browser:
	bash scripts/install_browser.sh

# Debian's Slurm and munge for tests/system/test_slurm.py, which starts a one-node cluster (does nothing when present;
# exit 3 = cannot install here, e.g. not root: the Slurm tests then skip with the reason)
slurm:
	bash scripts/slurm/local_cluster.sh install || test $$? = 3

# Every notebook execution of a `make test` is logged here (tests/notebook_runs.py); tests/notebooks/test_all_executed_once.py
# reads it last: each notebook ran whole exactly once, the hosted, browser and AVX2 paths only a few of its cells.
EXEC_LOG    := $(abspath results/exec-log.jsonl)
TEST_ENV     = MNIST_DATA_ROOT=$(abspath $(DATA_ROOT)) MNIST_EXEC_LOG=$(EXEC_LOG) MNIST_NB_TIMEOUT=$(NB_TIMEOUT) \
               MNIST_NB_TOTAL=$(NB_TOTAL)
# 2 cores: two pytest-xdist workers; a module's tests go to one worker, each notebook's run is a class of its own
# (tests/conftest.py); the longest work units first (each notebook's run, the AVX2 profile), so that neither worker
# is left with a long one at the end: --no-loadscope-reorder keeps that order (xdist would sort by test
# count). `make test XDIST=` runs them one after another
XDIST       ?= -n 2 --dist loadscope --no-loadscope-reorder
# the markers of tests that start something, and of the few slow ones (tests/conftest.py, docs/TESTING.md);
# `make check` leaves them out
STARTS      := process or kernel or system or slow

# The inner loop (docs/TESTING.md): no process, kernel, server or browser; a few minutes on 2 cores.
check: data
	MNIST_DATA_ROOT=$(abspath $(DATA_ROOT)) $(PY) -m pytest tests -m "not ($(STARTS))" $(XDIST) -q \
	  -p no:cacheprovider --durations=10

# Every test but the notebooks' own runs (tests/notebooks/test_all_run.py, and 08's beside the tests that read its records).
NB_RUNS     := tests/notebooks/test_all_run.py tests/notebooks/test_n08_troubleshoot.py::TestNotebook08
unit: data browser slurm
	$(TEST_ENV) $(PY) -m pytest tests --ignore=tests/notebooks/test_all_run.py \
	  --deselect tests/notebooks/test_n08_troubleshoot.py::TestNotebook08 $(XDIST) -ra --durations=25

# Every notebook top to bottom in the quick profile, each once, with nbmake's runner (tests/notebooks/test_all_run.py).
# `pytest --nbmake notebooks/[0-9]*.ipynb` runs the same notebooks through the nbmake plugin.
notebooks: data
	$(TEST_ENV) MNIST_PROFILE=quick $(PY) -m pytest $(NB_RUNS) $(XDIST) -ra --durations=0 -p no:cacheprovider

# An AVX2-only CPU (most laptops: no AVX-512, no AMX, no native bf16), on any x86-64 CPU: oneDNN and ATen limited
# to AVX2. The unit tests that touch AMP, memory, throughput and the speedrun, then the cells of notebooks 05 and 10
# whose choices depend on the CPU's instructions (tests/notebooks/test_n05_n10_avx2.py; the notebooks run whole once, natively).
# torch.compile's on-disk cache is not keyed by ATEN_CPU_CAPABILITY: code cached by a native run, replayed under
# avx2, computed out-of-bounds indices (torch 2.14.1, measured), so this profile compiles into its own cache.
AVX2_ENV    := ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MNIST_EXPECT_AVX2=1 \
               TORCHINDUCTOR_CACHE_DIR=$(abspath results/avx2/inductor-cache)
AVX2_TESTS  := tests/system/test_platforms.py tests/notebooks/test_n05_precision.py tests/core/test_memory.py tests/notebooks/test_n01_throughput.py \
               tests/notebooks/test_n10_speedrun.py tests/notebooks/test_n09_autotune.py tests/notebooks/test_n05_n10_avx2.py
test-avx2: data
	$(MAKE) --no-print-directory avx2-tests

# the AVX2 profile's pytest session alone, without the install step: `make test` runs it as one item of its own
# session (tests/system/test_avx2_profile.py), beside the other worker's tests instead of after them
avx2-tests:
	$(AVX2_ENV) $(TEST_ENV) MNIST_RESULTS_DIR=$(abspath results/avx2) \
	  $(PY) -m pytest $(AVX2_TESTS) -ra -p no:cacheprovider

# mnist_helpers/lessons/nNN/saved.py: the code each notebook marks #@save, copied as written (tests/course/test_saved.py checks it is current)
saved: install
	$(PY) scripts/build_saved.py

# docs/CLAIMS.md (every claim, its verdict per machine, the evidence) and the README's claims summary, regenerated
# from results/reference/ (tests/course/test_claims.py checks both are current)
claims: install
	$(PY) scripts/make_claims.py

# the README's notebook table and docs/INSTRUCTOR.md's runtime table, written from the series registry
# (mnist_helpers/course/series.py; tests/course/test_series.py checks both are current)
tables: install
	$(PY) scripts/make_tables.py

# the diagrams in notebooks/figures/ (data-parallel step, ring all-reduce, DistributedSampler, torchrun roles,
# DDP vs ZeRO-1 vs FSDP memory), drawn with matplotlib; tests/course/test_diagrams.py checks the script
diagrams: install
	$(PY) scripts/make_diagrams.py

# the README's test command: every test (units, each notebook once, Slurm, the browser, the AVX2 profile as one item:
# tests/system/test_avx2_profile.py), then the check that each notebook ran whole exactly once. Phase times: docs/TESTING.md.
test: data browser slurm
	@rm -f $(EXEC_LOG)
	@date +'make test: units, notebooks and the AVX2 profile from %T'
	$(TEST_ENV) $(PY) -m pytest tests $(XDIST) -ra --durations=40 -p no:cacheprovider
	@date +'make test: the execution log at %T'
	$(TEST_ENV) MNIST_EXEC_CHECK=1 $(PY) -m pytest tests/notebooks/test_all_executed_once.py -ra -p no:cacheprovider -s -q

# The full profile under nbmake, no time limits (cells of 10 run for minutes); outputs are written into the
# notebook (--overwrite): `make strip` before committing.
full: data
	MNIST_DATA_ROOT=$(abspath $(DATA_ROOT)) MNIST_PROFILE=full $(PY) -m pytest --nbmake --nbmake-timeout=7200 \
	  --timeout=0 --overwrite -p no:cacheprovider -ra notebooks/$(NB)*.ipynb

strip: install
	$(PY) -m mnist_helpers.course.nbstrip notebooks

# Re-insert every notebook's exercise cells and rewrite notebooks/solutions/ from mnist_helpers/course/exercises.py.
exercises: install
	$(PY) scripts/build_exercises.py
	$(PY) -m mnist_helpers.course.nbstrip notebooks

clean:
	rm -rf .pytest_cache build *.egg-info results/*.tmp
	find . -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(DATA_ROOT)
