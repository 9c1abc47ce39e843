# The two commands of the lab (see README.md): `make run` and `make test`.
# Each creates .venv and installs requirements.txt plus labsupport (editable) on first use;
# later calls find the stamp file and skip the installs.
# Instructors: `make release` regenerates notebooks/ from the masters in autograder/source/lab/
# (python -m autograder release); commit the masters and notebooks/ afterwards.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-long data release browser sandbox slurm clean

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed: set PYTHON=python3.11")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@# setuptools' editable build prints a BuildBackendWarning that reads as a fault; it is not
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

run: $(STAMP)
	$(PY) -m labsupport data
	$(PY) -m autograder run

# pytest-xdist, a worker per core, a test file per worker at a time (--dist loadfile), in the order
# tests/conftest.py gives (--no-loadscope-reorder; its LONGEST_FIRST, then the rest by size): the
# instructor tests, which grade the class once in a module fixture (the long pole), start first,
# the other files run beside them, longest first, and the short files last, so that both workers
# end together. The tests marked `long` (the lab on other ground: a Slurm cluster, a Colab
# stand-in, the real profile and dataset, a profile that grades speed, DDP in two processes, the
# style families through the judge, Inductor building the training step, a judge with no cgroup to
# freeze) run in `make test-long`; CI (.ci/run) runs both.
test: $(STAMP) browser sandbox slurm
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder -m "not long"

test-long: $(STAMP) browser sandbox slurm
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder -m long

# The HTML report's test renders it in Debian's chromium. Install it when we can (root, apt); the
# test skips visibly, saying how to install it, where we cannot.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && echo "installing chromium (apt) for the HTML report test" \
	  && apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
	     apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
	  || echo "chromium is not installed: the HTML report test will be skipped (apt-get install chromium)"

# Grading runs each submission in a bubblewrap sandbox (autograder/sandbox.py); the instructor
# tests grade hostile submissions in it. Install it when we can (root, apt); grading says so, and
# those tests skip visibly, where we cannot.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && echo "installing bubblewrap (apt) for the grading sandbox" \
	  && { apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1 || { apt-get update -qq >/dev/null \
	       && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null; }; }; } \
	  || echo "bubblewrap is not installed: grading runs without a sandbox, and its tests are skipped (apt-get install bubblewrap)"

# The cluster grading test (tests/test_instructor.py) starts a one-node Slurm cluster with two fake
# GPUs from Debian's packages. Install them when we can (root, apt); the test skips visibly where
# we cannot. Nothing is configured or started here: the test runs its own daemons and stops them.
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
slurm:
	@{ command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged; } >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && echo "installing Slurm and munge (apt) for the cluster grading test" \
	  && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null 2>&1 || { apt-get update -qq >/dev/null \
	       && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null; }; }; } \
	  || echo "Slurm is not installed: the cluster grading test will be skipped (apt-get install $(SLURM_PACKAGES))"

data: $(STAMP)
	$(PY) -m labsupport data

release: $(STAMP)
	$(PY) -m autograder release

clean:
	rm -rf $(VENV) build results data/lab-shapes
